-- A group commit writes the facts that belong to the whole batch once per batch, not once
-- per purchase (BENCHMARKS.md, "Where the CPU goes"): one stock-log row per product and
-- stock generation for the units the batch moved, and one outbox row per product packing
-- the batch's `order_created` events. Per purchase it still writes the reservation and
-- the order, the facts every other one is derived from; per batch the database had been
-- writing, for each order, a stock-log row repeating its reservation, an event row and
-- the trigger's unsent mark, each with its own index entries.

-- The stock log (库存流水) of group commits: the units one transaction moved from
-- available to reserved for one product, in one counter UPDATE. Which purchases they
-- were is in the reservations and orders the same transaction wrote; `flashsale audit`
-- checks that every order's units were logged once (this table and the `reserve` rows
-- that a purchase committed on its own still writes to inventory_log) and that the
-- counters agree.
CREATE TABLE inventory_batch_log (
    id           BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    product_id   BIGINT      NOT NULL,
    generation   BIGINT      NOT NULL COMMENT 'stock generation of the batch''s holds',
    orders       INT         NOT NULL COMMENT 'purchases of the batch for this product',
    quantity     BIGINT      NOT NULL COMMENT 'units moved from available to reserved',
    create_time  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    KEY idx_batch_log_product (product_id),
    CONSTRAINT chk_batch_log_amounts CHECK (orders > 0 AND quantity >= orders)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- An outbox row is one event, as before, or a pack: several events of one type and
-- product that one transaction wrote, its payload a JSON array of the event objects
-- (each exactly as a single event row's payload holds it), its request_id, event_id,
-- order_id and sequence NULL (they are in each element). The relay publishes a pack's
-- events one by one and marks the row sent once all of them were acknowledged. A pack's
-- events are `order_created` events, sequence 1 of their request_id; a later event of
-- the same request_id (paid, cancelled, released) is a row of its own.
ALTER TABLE outbox
    MODIFY event_id VARCHAR(64) NULL COMMENT 'NULL for a pack (each event carries its id)',
    MODIFY request_id VARCHAR(64) NULL COMMENT 'NULL for a pack',
    MODIFY sequence INT NULL COMMENT 'position among the events of this request_id, from 1; NULL for a pack',
    ADD COLUMN events INT NOT NULL DEFAULT 1 COMMENT 'events in the row: 1, or a pack''s count',
    ADD CONSTRAINT chk_outbox_form CHECK (
        (request_id IS NOT NULL AND event_id IS NOT NULL AND sequence IS NOT NULL
            AND events = 1)
        OR (request_id IS NULL AND event_id IS NULL AND sequence IS NULL
            AND order_id IS NULL AND events > 0));

-- The outbox one event per row, packs unpacked: what the audit and the tests read.
CREATE VIEW outbox_event AS
    SELECT o.id, o.event_id, o.event_type, o.request_id, o.order_id, o.product_id,
        o.sequence, o.payload, o.created_at
    FROM outbox o WHERE o.request_id IS NOT NULL
    UNION ALL
    SELECT o.id, e.event_id, o.event_type, e.request_id, e.order_id, o.product_id,
        e.sequence, e.payload, o.created_at
    FROM outbox o, JSON_TABLE(o.payload, '$[*]' COLUMNS (
        event_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.event_id',
        request_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.request_id',
        order_id BIGINT PATH '$.order_id',
        sequence INT PATH '$.sequence',
        payload JSON PATH '$')) AS e
    WHERE o.request_id IS NULL;

-- The group commit's rows, replacing migration …08's procedure. It reads the same batch
-- document from @fs_batch (one array per purchase: [request_id, product_id, user_id,
-- quantity, hold_id, generation, payment timeout in microseconds, order_created event id,
-- per-user limit or null]; `crate::group::document` writes it) and returns the same one
-- result set, the new orders' ids and times: per purchase, its reservation PROCESSING and
-- its order PENDING_PAYMENT. The batch's stock-log rows follow in the same script, one
-- INSERT per product and generation with the counts the server has (group.rs), and its
-- events, one call of group_commit_events per product.
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
        request_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]',
        product_id BIGINT PATH '$[1]', user_id BIGINT PATH '$[2]', quantity INT PATH '$[3]',
        hold_id BIGINT PATH '$[4]', generation BIGINT PATH '$[5]')) AS b;

    INSERT INTO orders
        (request_id, user_id, product_id, quantity, status, created_at, expires_at)
    SELECT b.request_id, b.user_id, b.product_id, b.quantity, 'PENDING_PAYMENT', NOW(6),
        NOW(6) + INTERVAL b.timeout_us MICROSECOND
    FROM JSON_TABLE(@fs_batch, '$[*]' COLUMNS (
        request_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]',
        product_id BIGINT PATH '$[1]', user_id BIGINT PATH '$[2]', quantity INT PATH '$[3]',
        timeout_us BIGINT PATH '$[6]')) AS b
    RETURNING id, CONVERT(request_id USING utf8mb4) AS request_id, created_at, expires_at;
END;

-- The pack of `order_created` events of one product's purchases in @fs_batch, after
-- group_commit_insert wrote their orders: one outbox row, each event as a single row
-- would hold it. One call per product rather than a GROUP BY over the batch, and each
-- event cast to CHAR(512) before GROUP_CONCAT joins them: MariaDB keeps an aggregate's
-- values in a temporary table, on disk when a value may be longer than 512 characters
-- (a JSON_OBJECT's declared length is), and a temporary table on disk for every batch
-- measured cost more than the rows the pack saves. An event is at most 369 characters
-- (a request_id is 64 characters that need no escaping, ids are 19 digits at most), so
-- the cast never cuts one; one that it did cut would fail the outbox's JSON check and
-- roll the batch back, never lose an event. GROUP_CONCAT is bounded by
-- group_concat_max_len; a batch is at most 256 purchases (GROUP_COMMIT_MAX), under
-- 100 KB of events, so the procedure makes sure the session allows 1 MiB (MariaDB's
-- default).
CREATE PROCEDURE group_commit_events(IN batch_product BIGINT)
    MODIFIES SQL DATA
    SQL SECURITY INVOKER
    COMMENT 'flashsale group commit: the order_created events of one product in @fs_batch'
BEGIN
    IF @@SESSION.group_concat_max_len < 1048576 THEN
        SET SESSION group_concat_max_len = 1048576;
    END IF;

    INSERT INTO outbox (event_type, product_id, events, payload, created_at)
    SELECT 'order_created', batch_product, COUNT(*),
        CONCAT('[', GROUP_CONCAT(CAST(JSON_OBJECT('event_id', b.event_id,
            'event_type', 'order_created', 'sequence', 1, 'order_id', o.id,
            'request_id', o.request_id, 'product_id', o.product_id, 'user_id', o.user_id,
            'quantity', o.quantity, 'reason', NULL,
            'occurred_at', DATE_FORMAT(NOW(6), '%Y-%m-%dT%H:%i:%s.%fZ')) AS CHAR(512))),
            ']'),
        NOW(6)
    FROM JSON_TABLE(@fs_batch, '$[*]' COLUMNS (
        request_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]',
        product_id BIGINT PATH '$[1]',
        event_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[7]')) AS b
    JOIN orders o ON o.request_id = b.request_id
    WHERE b.product_id = batch_product
    HAVING COUNT(*) > 0;
END;
