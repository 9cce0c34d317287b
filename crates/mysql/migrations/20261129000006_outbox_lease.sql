-- Cheaper writes per order (BENCHMARKS.md, "sustained").
--
-- The relay leases the whole outbox (one row here) instead of each event row. A per-row
-- lease wrote every event row twice more (claim, then sent) and kept an index on the
-- claim; measured, the claim alone cost more MariaDB time per order than inserting the
-- order. One relay at a time publishes: the holder renews the lease each round; another
-- instance's relay takes over once it ends (a relay that died holds events back for at
-- most one lease).
CREATE TABLE outbox_lease (
    id           TINYINT      NOT NULL PRIMARY KEY,
    holder       VARCHAR(64)  NULL COMMENT 'relay instance holding the lease',
    lease_until  DATETIME(6)  NULL COMMENT 'the lease ends here (database clock)',
    CONSTRAINT chk_outbox_lease_one CHECK (id = 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
INSERT INTO outbox_lease (id) VALUES (1);

ALTER TABLE outbox DROP KEY idx_outbox_claim, DROP COLUMN claimed_by, DROP COLUMN claimed_until;

-- The same columns as the unique uk_reservation_hold: a second copy of that index.
ALTER TABLE inventory_reservation DROP KEY idx_reservation_hold;
