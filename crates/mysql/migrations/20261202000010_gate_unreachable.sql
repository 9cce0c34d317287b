-- The way back from ledger mode waits until no instance has reported the gate (Redis)
-- unreachable for a while. Every instance that cannot reach Redis while a product is in
-- ledger mode refreshes this time, so one instance that can reach Redis does not give the
-- product back to a gate the others cannot reach (the mode would thrash between them).
ALTER TABLE product_inventory
    ADD COLUMN gate_unreachable_at DATETIME(6) NULL
        COMMENT 'the last report of an instance that could not reach the gate',
    -- The instances poll for the products in ledger mode several times a second.
    ADD INDEX idx_stock_mode (stock_mode);
