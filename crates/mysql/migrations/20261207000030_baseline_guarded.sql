-- The guarded baselines' purchase transaction (issue 42): db-optimistic (a version
-- column, retried on conflict) and redis-lock (a per-product Redis lock around the
-- deduction) share it, and differ only in p_version: the version the caller read
-- (db-optimistic), or NULL when the caller holds the product's lock (redis-lock).
-- One CALL, one round trip per attempt, like migration 12's procedures
-- (`crates/mysql/src/baseline.rs`); the retries and the lock are the caller's.
--
-- Unlike migration 12's seed designs, it keeps what a seasoned engineer keeps:
--   * a replay first: a request_id that has an order is answered with it, sold out or
--     not (the unique key still decides a race between two copies: 1062 -> replay);
--   * the per-user limit (products.per_user_limit), summed over the user's live orders
--     of the product after the UPDATE has taken the product row's lock: the session
--     reads READ COMMITTED, and the lock orders the product's purchases, so the sum
--     sees every order committed before this one, whatever guarded the caller (a lock
--     whose lease ran out included);
--   * `available_stock >= q` in the UPDATE even under a lock: a lease that expires
--     mid-transaction lets two transactions run at once, and the condition (with the
--     row lock) still sells exactly the stock.
--
-- One result set of one row; its first column decides the others (read by position,
-- as migration 12's: `crate::baseline`'s `column` module):
--   'created', 'replay', 'sold_out' : as migration 12's procedures answer them
--   'limit_exceeded'                : nothing was written
--   'conflict', version, available  : (p_version only) the row was at another version
--                                     with stock left; nothing was written; the row as
--                                     read right after, for the caller's next attempt
-- The version is product_inventory.version, which every change of the row's counters
-- moves (flashsale's own paths included), so a conflict means the row really changed.

-- The answer to a request_id that has an order: its row, as migration 12's procedures
-- answer a replay (one statement of their three handlers, shared here by the two
-- places baseline_guarded answers one).
CREATE PROCEDURE baseline_replay(
    IN p_request_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
    READS SQL DATA
    SQL SECURITY INVOKER
    COMMENT 'baselines: the replay answer, the request_id''s order'
BEGIN
    SELECT 'replay' AS outcome, o.id, o.created_at, o.expires_at, o.request_id,
        o.user_id, o.product_id, o.quantity, o.status, o.paid_at, o.cancelled_at,
        o.cancel_reason
    FROM orders o WHERE o.request_id = p_request_id;
END;

CREATE PROCEDURE baseline_guarded(
    IN p_request_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_user_id BIGINT, IN p_product_id BIGINT, IN p_quantity INT, IN p_timeout_us BIGINT,
    IN p_version BIGINT)
    MODIFIES SQL DATA
    SQL SECURITY INVOKER
    COMMENT 'baselines db-optimistic and redis-lock: guarded UPDATE, per-user limit, order'
body: BEGIN
    DECLARE v_now DATETIME(6);
    DECLARE v_limit BIGINT DEFAULT NULL;
    DECLARE v_live BIGINT DEFAULT 0;
    DECLARE v_available BIGINT DEFAULT NULL;
    DECLARE v_version BIGINT DEFAULT NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        RESIGNAL;
    END;
    DECLARE EXIT HANDLER FOR 1062
    BEGIN
        ROLLBACK;
        CALL baseline_replay(p_request_id);
    END;

    IF EXISTS (SELECT 1 FROM orders WHERE request_id = p_request_id) THEN
        CALL baseline_replay(p_request_id);
        LEAVE body;
    END IF;

    START TRANSACTION;
    UPDATE product_inventory SET available_stock = available_stock - p_quantity,
        pre_deduct_stock = pre_deduct_stock + p_quantity, version = version + 1
    WHERE product_id = p_product_id AND available_stock >= p_quantity
        AND (p_version IS NULL OR version = p_version);
    IF ROW_COUNT() <> 1 THEN
        ROLLBACK;
        SELECT available_stock, version INTO v_available, v_version
        FROM product_inventory WHERE product_id = p_product_id;
        IF p_version IS NULL OR v_available IS NULL OR v_available < p_quantity THEN
            SELECT 'sold_out' AS outcome;
        ELSE
            SELECT 'conflict' AS outcome, v_version AS version, v_available AS available;
        END IF;
        LEAVE body;
    END IF;

    SELECT per_user_limit INTO v_limit FROM products WHERE product_id = p_product_id;
    IF v_limit IS NOT NULL THEN
        SELECT COALESCE(SUM(quantity), 0) INTO v_live FROM orders
        WHERE user_id = p_user_id AND product_id = p_product_id
            AND status IN ('PENDING_PAYMENT', 'PAID');
        IF v_live + p_quantity > v_limit THEN
            ROLLBACK;
            SELECT 'limit_exceeded' AS outcome;
            LEAVE body;
        END IF;
    END IF;

    SET v_now = NOW(6);
    INSERT INTO orders (request_id, user_id, product_id, quantity, status, created_at,
        expires_at)
    VALUES (p_request_id, p_user_id, p_product_id, p_quantity, 'PENDING_PAYMENT', v_now,
        v_now + INTERVAL p_timeout_us MICROSECOND);
    COMMIT;
    SELECT 'created' AS outcome, CAST(LAST_INSERT_ID() AS SIGNED) AS id,
        v_now AS created_at, v_now + INTERVAL p_timeout_us MICROSECOND AS expires_at;
END;
