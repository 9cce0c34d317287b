-- The repairs reconciliation made to a product's available count in Redis, each with the
-- facts it was computed from (app/src/maintenance/reconcile.rs): what a person reads to
-- trace why a count moved. A repair happens only for a drift seen twice with the gate
-- unchanged in between, and a pass repairs a bounded number of units: rows are few.
CREATE TABLE stock_repair (
    id               BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    product_id       BIGINT       NOT NULL,
    generation       BIGINT       NOT NULL,
    redis_before     BIGINT       NOT NULL,
    redis_after      BIGINT       NOT NULL,
    expected         BIGINT       NOT NULL,
    total_stock      BIGINT       NOT NULL,
    live_units       BIGINT       NOT NULL,
    in_flight_units  BIGINT       NOT NULL,
    reason           VARCHAR(128) NOT NULL,
    repaired_at      DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    KEY idx_stock_repair_product (product_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
