-- Stock modes: who serves a product's stock. GATE: purchases take a hold in the stock
-- gate (Redis) and the ledger commits it. LEDGER: the ledger alone decides and records
-- each purchase (`available_stock >= q` in its conditional UPDATE), so the sale goes on
-- while the gate is unavailable. The mode lives beside the generation because every
-- switch advances the generation in the same transaction: entering LEDGER voids every
-- hold the gate handed out before (their commits find another generation), and leaving
-- it is the advance-and-rebuild of the gate from the ledger's facts.
ALTER TABLE product_inventory
    ADD COLUMN stock_mode ENUM('GATE', 'LEDGER') NOT NULL DEFAULT 'GATE'
        COMMENT 'who serves the stock: the gate (Redis) or the ledger',
    ADD COLUMN mode_changed_at DATETIME(6) NULL COMMENT 'the last switch of stock_mode',
    -- In LEDGER mode the ledger hands out the hold ids itself, counting up from 1 in the
    -- generation the switch started (a purchase takes ledger_hold_seq + 1 in its counter
    -- UPDATE), so its reservations keep the (product, generation, hold id) key every
    -- other path names a hold by, and the rebuild on the way back starts above them.
    ADD COLUMN ledger_hold_seq BIGINT NOT NULL DEFAULT 0
        COMMENT 'last hold id the ledger handed out in the current generation (LEDGER mode)';
