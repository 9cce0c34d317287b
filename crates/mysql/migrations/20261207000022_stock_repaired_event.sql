-- A repair reconciliation makes (a `stock_repair` row) is also an event: the row and an
-- outbox row of type `stock_repaired` are written in one transaction
-- (`MysqlLedger::record_repair_at`), so the repair reaches the broker exactly when its
-- record committed, like every order's change. Its request_id is `REPAIR_<stock_repair
-- id>`, its sequence 1, its order_id null; its payload carries the repair's facts
-- (docs/events.md). The outbox's CHECK on the event type gains the new name.
--
-- Dropped and added in two statements (MariaDB refuses a second constraint of the same
-- name in one); adding it reads the outbox once to check its rows, as the earlier
-- migrations' changes to the outbox did.
ALTER TABLE outbox DROP CONSTRAINT chk_outbox_type;

ALTER TABLE outbox ADD CONSTRAINT chk_outbox_type CHECK (event_type IN
    ('order_created', 'order_paid', 'order_cancelled', 'reservation_released',
     'stock_repaired'));
