-- Refunds: the operator moves a PAID order to REFUNDED (POST /v1/orders/{id}/refund). In
-- one transaction the order becomes REFUNDED (`refunded_at` set), its CONFIRMED
-- reservation becomes RELEASED with release_reason `refund_restocked` (the units go back
-- on sale: available + q) or `refund_withdrawn` (they leave the stock: total - q),
-- sold_count drops by q either way, a `refund` row enters the stock log, an
-- `order_refunded` event is written under the order's own request_id (after its
-- `order_paid`), and the operator's log gains its line. The conditional UPDATE
-- (`… WHERE status = 'PAID'`) makes a refund happen once.
ALTER TABLE orders ADD COLUMN refunded_at DATETIME(6) NULL
    COMMENT 'when the operator refunded the paid order';

ALTER TABLE orders DROP CONSTRAINT chk_orders_status;

ALTER TABLE orders ADD CONSTRAINT chk_orders_status CHECK (status IN
    ('PENDING_PAYMENT', 'PAID', 'CANCELLED', 'REFUNDED'));

ALTER TABLE inventory_log DROP CONSTRAINT chk_log_type;

ALTER TABLE inventory_log ADD CONSTRAINT chk_log_type CHECK (type IN
    ('reserve', 'confirm', 'release', 'restock', 'refund'));

-- Dropped and added in two statements, as in migration …22.
ALTER TABLE outbox DROP CONSTRAINT chk_outbox_type;

ALTER TABLE outbox ADD CONSTRAINT chk_outbox_type CHECK (event_type IN
    ('order_created', 'order_paid', 'order_cancelled', 'reservation_released',
     'stock_repaired', 'product_paused', 'product_resumed', 'product_changed',
     'order_refunded'));

-- The consumer's statistics count refunds: `order_refunded` events and their units.
ALTER TABLE sales_stats
    ADD COLUMN orders_refunded BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN units_refunded  BIGINT NOT NULL DEFAULT 0;
