-- A paused sale: purchases of the product are refused with `sale_paused` while it is 1
-- (pay, cancel and expiry go on). The instances read it with the product's definition
-- and forget their cached copy when a change is announced (app/src/control.rs).
ALTER TABLE products ADD COLUMN paused TINYINT(1) NOT NULL DEFAULT 0
    COMMENT '1 while the operator has paused the sale';

-- The operator's log: every admin action on a product, with its request_id (the key that
-- makes the action idempotent: a retry finds its row and changes nothing), which admin
-- token made it, what it asked for (a PATCH's fields; NULL where the action says it
-- all, a pause), and the product's state before and after, as JSON. Admin actions are a
-- person's clicks and scripts, so rows are few; the per-product index serves the log's
-- pages (GET /v1/admin/actions?product_id=).
CREATE TABLE admin_action (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    request_id   VARCHAR(64)  NOT NULL,
    action       VARCHAR(16)  NOT NULL,
    product_id   BIGINT       NOT NULL,
    admin        VARCHAR(64)  NOT NULL,
    asked        JSON         NULL,
    before_state JSON         NOT NULL,
    after_state  JSON         NOT NULL,
    acted_at     DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    UNIQUE KEY uk_admin_action_request (request_id),
    KEY idx_admin_action_product (product_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- A pause, a resume and a change are events too (`product_paused`, `product_resumed`,
-- `product_changed`), written in the action's transaction with request_id
-- `ADMIN_<admin_action id>`, sequence 1 and no order (docs/events.md). The outbox's CHECK
-- on the event type gains the three names, in two statements as in migration …22.
ALTER TABLE outbox DROP CONSTRAINT chk_outbox_type;

ALTER TABLE outbox ADD CONSTRAINT chk_outbox_type CHECK (event_type IN
    ('order_created', 'order_paid', 'order_cancelled', 'reservation_released',
     'stock_repaired', 'product_paused', 'product_resumed', 'product_changed'));
