-- A hold id is handed out once per product and stock generation. Redis coming back
-- behind (a failover that lost its last writes) hands out ids again; this key makes
-- such a hold fail to commit, and the ledger then advances the generation so the gate
-- is rebuilt from the facts (found by the deterministic simulator).
ALTER TABLE inventory_reservation
    ADD UNIQUE KEY uk_reservation_hold (product_id, generation, hold_id);
