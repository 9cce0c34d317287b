-- Buyer-scoped request_ids. With buyers authenticated (jwt, header), a purchase's
-- idempotency key is `{user_id}/{request_id}` (flashsale_core::RequestId::scoped), so one
-- buyer's request_id can neither reveal nor squat another's. A key is then at most 84
-- characters (19 digits, the `/`, 64): every column and JSON_TABLE column that holds a
-- purchase's key widens from 64 to 84. utf8mb4 columns of 64 characters already had a
-- two-byte length, so MariaDB widens them in place, without copying the tables. The
-- unique keys stay what they were, over the whole key: (user_id, request_id) in effect.
-- Which form a ledger holds is recorded in `request_scope` (below). restock_request keeps
-- its width: an admin's request_id is never scoped.
ALTER TABLE orders MODIFY request_id VARCHAR(84) NOT NULL;
ALTER TABLE inventory_reservation MODIFY request_id VARCHAR(84) NOT NULL;
ALTER TABLE inventory_log MODIFY request_id VARCHAR(84) NOT NULL;
ALTER TABLE recovery_incident MODIFY request_id VARCHAR(84) NOT NULL;
ALTER TABLE outbox MODIFY request_id VARCHAR(84) NULL COMMENT 'NULL for a pack';

CREATE OR REPLACE VIEW outbox_event AS
    SELECT o.id, o.event_id, o.event_type, o.request_id, o.order_id, o.product_id,
        o.sequence, o.payload, o.created_at
    FROM outbox o WHERE o.request_id IS NOT NULL
    UNION ALL
    SELECT o.id, e.event_id, o.event_type, e.request_id, e.order_id, o.product_id,
        e.sequence, e.payload, o.created_at
    FROM outbox o, JSON_TABLE(o.payload, '$[*]' COLUMNS (
        event_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.event_id',
        request_id VARCHAR(84) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.request_id',
        order_id BIGINT PATH '$.order_id',
        sequence INT PATH '$.sequence',
        payload JSON PATH '$')) AS e
    WHERE o.request_id IS NULL;

-- group_commit_insert as migration …13 wrote it, its request_id columns 84 wide.
DROP PROCEDURE group_commit_insert;

CREATE PROCEDURE group_commit_insert()
    MODIFIES SQL DATA
    SQL SECURITY INVOKER
    COMMENT 'flashsale group commit: the rows of the purchases in @fs_batch'
BEGIN
    INSERT INTO inventory_reservation
        (request_id, product_id, user_id, quantity, hold_id, generation, status)
    SELECT b.request_id, b.product_id, b.user_id, b.quantity, b.hold_id, b.generation,
        'PROCESSING'
    FROM JSON_TABLE(@fs_batch, '$[*]' COLUMNS (
        request_id VARCHAR(84) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]',
        product_id BIGINT PATH '$[1]', user_id BIGINT PATH '$[2]', quantity INT PATH '$[3]',
        hold_id BIGINT PATH '$[4]', generation BIGINT PATH '$[5]')) AS b;

    INSERT INTO orders
        (request_id, user_id, product_id, quantity, status, created_at, expires_at)
    SELECT b.request_id, b.user_id, b.product_id, b.quantity, 'PENDING_PAYMENT', NOW(6),
        NOW(6) + INTERVAL b.timeout_us MICROSECOND
    FROM JSON_TABLE(@fs_batch, '$[*]' COLUMNS (
        request_id VARCHAR(84) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]',
        product_id BIGINT PATH '$[1]', user_id BIGINT PATH '$[2]', quantity INT PATH '$[3]',
        timeout_us BIGINT PATH '$[6]')) AS b
    RETURNING id, CONVERT(request_id USING utf8mb4) AS request_id, created_at, expires_at;
END;

-- Which form the ledger's purchase keys take: 'global' (the request_id as sent, one
-- namespace for all buyers: buyers not authenticated) or 'buyer' (scoped by buyer). The
-- first instance to start records its own; an instance configured for the other form
-- refuses to start, because its keys would miss the ledger's and a retry would become a
-- second purchase. `flashsale ledger rescope` rewrites the keys from one form to the other
-- with every instance stopped. One row: its primary key is the constant 1.
CREATE TABLE request_scope (
    id          TINYINT     NOT NULL PRIMARY KEY,
    scope       VARCHAR(16) NOT NULL,
    changed_at  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    CONSTRAINT chk_request_scope_one CHECK (id = 1),
    CONSTRAINT chk_request_scope CHECK (scope IN ('global', 'buyer'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- A ledger that already holds purchases was written by a version that never scoped its
-- keys: it is 'global' whatever the instances are configured for now.
INSERT INTO request_scope (id, scope)
    SELECT 1, 'global' FROM DUAL WHERE EXISTS (SELECT 1 FROM inventory_reservation);
