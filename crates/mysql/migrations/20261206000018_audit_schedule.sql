-- The audits `serve` runs by itself (`app/src/maintenance/schedule.rs`): each product's
-- once its sale has ended and settled (kind 'sale_end', scope its product id), and every
-- product's once per period (kind 'every', scope the period's number since the Unix
-- epoch). A row is a claim: the instance that inserts it runs the audit, another takes
-- it over only once the claim is older than its lease and still not done, and a done
-- audit is never run again. One row per product and one per period: bounded by them.
CREATE TABLE audit_schedule (
    kind        VARCHAR(16)  NOT NULL,
    scope       BIGINT       NOT NULL,
    holder      VARCHAR(64)  NOT NULL,
    claimed_at  DATETIME(6)  NOT NULL,
    done_at     DATETIME(6)  NULL,
    PRIMARY KEY (kind, scope)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
