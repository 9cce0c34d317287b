-- Destocks: an admin takes available units off sale (POST /v1/products/{id}/destock).
-- In gate mode the gate (Redis) is the authority on available units, so a destock is
-- first recorded here as an intent, `pending`, in the product's stock generation, with no
-- counter changed; `destock.lua` takes the units in Redis if that many are available (a
-- marker keeps its outcome), and the ledger then settles the intent: `taken` (the
-- counters, the stock log's 'destock' row, the operator's log line and its event, in one
-- transaction) or `refused` (nothing else changes). An intent left pending by a crash is
-- settled by the workers (app/src/destock.rs). In ledger mode the intent is recorded
-- settled, by the counters, in one transaction. The request_id is the admin's, of the
-- operator's log's namespace (`admin_action`), never a purchase's; the admin is kept for
-- the log line written when the intent settles.
CREATE TABLE destock_request (
    request_id   VARCHAR(64) NOT NULL PRIMARY KEY,
    product_id   BIGINT      NOT NULL,
    quantity     BIGINT      NOT NULL,
    admin        VARCHAR(64) NOT NULL,
    generation   BIGINT      NOT NULL COMMENT 'the stock generation the gate is asked to take it in',
    state        VARCHAR(8)  NOT NULL,
    created_at   DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    settled_at   DATETIME(6) NULL,
    KEY idx_destock_pending (state, created_at),
    KEY idx_destock_product (product_id, state),
    CONSTRAINT chk_destock_state CHECK (state IN ('pending', 'taken', 'refused')),
    CONSTRAINT chk_destock_quantity CHECK (quantity > 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The stock log's row of a taken destock: type 'destock', its quantity the units taken
-- off the total and the available count, under the destock's request_id. The CHECK on the
-- type gains the name, dropped and added in two statements as the outbox's below.
ALTER TABLE inventory_log DROP CONSTRAINT chk_log_type;

ALTER TABLE inventory_log ADD CONSTRAINT chk_log_type CHECK (type IN
    ('reserve', 'confirm', 'release', 'restock', 'refund', 'destock'));

-- A taken destock is an event too (`product_destocked`), written with its operator's log
-- line with request_id `ADMIN_<admin_action id>`, as a pause's (migration 33).
ALTER TABLE outbox DROP CONSTRAINT chk_outbox_type;

ALTER TABLE outbox ADD CONSTRAINT chk_outbox_type CHECK (event_type IN
    ('order_created', 'order_paid', 'order_cancelled', 'reservation_released',
     'stock_repaired', 'product_paused', 'product_resumed', 'product_changed',
     'order_refunded', 'product_destocked'));
