-- The verdicts of `flashsale audit`, so an operator's page can say "last audit: clean,
-- 2 min ago" (or "never"). Bounded: recording a verdict deletes the rows older than the
-- newest 100 (AUDIT_RUNS_KEPT) in the same transaction.
CREATE TABLE audit_run (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    recorded_at  DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    -- NULL: every product whose stock was loaded; else the one product audited.
    product_id   BIGINT       NULL,
    products     BIGINT       NOT NULL,
    violations   BIGINT       NOT NULL,
    pending      BIGINT       NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
