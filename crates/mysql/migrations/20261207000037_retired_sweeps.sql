-- A retired sale's Redis keys are deleted after its retirement commits
-- (app/src/after_sale.rs): `gate_sweep_generation` is the generation retired while that
-- deletion is still owed, and NULL once it is done. The workers' pass sweeps every
-- product it names, so a crash or a Redis failure between the two steps only delays the
-- deletion, never leaves the keys to their record TTL. Few rows are ever owed; the index
-- finds them without reading every product.
ALTER TABLE products
    ADD COLUMN gate_sweep_generation BIGINT NULL
        COMMENT 'a retired sale whose Redis keys are still to be deleted: the generation retired',
    ADD KEY idx_products_sweep (gate_sweep_generation);
