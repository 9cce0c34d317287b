-- The group commit's row inserts as a stored procedure (BENCHMARKS.md, eighth session).
--
-- A group commit sends its batch as one script: the batch document into @fs_batch, these
-- four INSERTs, one counter UPDATE per product, the per-user check when a product has a
-- limit (group.rs). Sent as text, each of the four long INSERTs was parsed again on every
-- commit; a procedure is parsed once per connection and then only executed. Measured
-- under load: MariaDB's CPU per order 97 -> 92 us, orders/s +3-5 %.
--
-- The procedure reads the batch from the session's @fs_batch, a JSON array with one
-- array per purchase, as `crate::group::document` writes it:
--   [request_id, product_id, user_id, quantity, hold_id, generation,
--    payment timeout in microseconds, order_created event id, per-user limit or null]
-- (`crate::group::batch_table!` reads the same document in Rust's statements; change both
-- together, with a new migration that replaces this procedure). It returns one result
-- set, the new orders' ids and times (INSERT ... RETURNING), so nothing reads them back.
-- The rows are what one purchase's transaction writes (`MysqlLedger::insert_purchase`):
-- the reservation PROCESSING, the order PENDING_PAYMENT expiring after its payment
-- timeout on the database's clock, its stock log row `reserve`, and its `order_created`
-- event (sequence 1: the request_id was free until this transaction), whose payload the
-- database builds, so its text is escaped by the server. NOW(6) is each statement's start
-- time. The rows are read in no particular order: nothing depends on the order they are
-- written in (orders are matched back by request_id), and an ORDER BY over JSON_TABLE
-- costs a sort through a temporary table.
--
-- It runs with the caller's privileges (SQL SECURITY INVOKER): the user that migrates
-- needs CREATE ROUTINE, the server's user EXECUTE.
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

    INSERT INTO inventory_log (request_id, product_id, order_id, quantity, type)
    SELECT o.request_id, o.product_id, o.id, o.quantity, 'reserve'
    FROM JSON_TABLE(@fs_batch, '$[*]' COLUMNS (
        request_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]')) AS b
    JOIN orders o ON o.request_id = b.request_id;

    INSERT INTO outbox (event_id, event_type, request_id, order_id, product_id, sequence,
        payload, created_at)
    SELECT b.event_id, 'order_created', o.request_id, o.id, o.product_id, 1,
        JSON_OBJECT('event_id', b.event_id, 'event_type', 'order_created', 'sequence', 1,
            'order_id', o.id, 'request_id', o.request_id, 'product_id', o.product_id,
            'user_id', o.user_id, 'quantity', o.quantity, 'reason', NULL,
            'occurred_at', DATE_FORMAT(NOW(6), '%Y-%m-%dT%H:%i:%s.%fZ')),
        NOW(6)
    FROM JSON_TABLE(@fs_batch, '$[*]' COLUMNS (
        request_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]',
        event_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[7]')) AS b
    JOIN orders o ON o.request_id = b.request_id;
END;
