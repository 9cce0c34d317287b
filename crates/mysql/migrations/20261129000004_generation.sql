-- Stock generations: each time the stock gate's state for a product is rebuilt from the
-- ledger's facts (Redis came back empty, or behind after a failover), the product's
-- generation goes up. Every hold carries the generation it was taken in, and a purchase
-- commits only if its generation is still the product's: a hold taken against the lost
-- state can never become an order after the rebuild counted stock without it.
ALTER TABLE product_inventory
    ADD COLUMN generation BIGINT NOT NULL DEFAULT 1 COMMENT 'stock gate generation';
ALTER TABLE inventory_reservation
    ADD COLUMN generation BIGINT NOT NULL DEFAULT 1 COMMENT 'generation the hold was taken in';
ALTER TABLE restock_request
    ADD COLUMN generation BIGINT NOT NULL DEFAULT 1 COMMENT 'generation the restock was recorded in';
-- The generation a reservation was released in (by cancel or expiry): its units go back
-- to the gate only while the gate is in that generation; a later rebuild counted them.
ALTER TABLE inventory_reservation
    ADD COLUMN released_generation BIGINT NULL COMMENT 'generation of the release';
-- The gate watch asks for the highest hold id recorded in the current generation.
ALTER TABLE inventory_reservation ADD KEY idx_reservation_hold (product_id, generation, hold_id);
