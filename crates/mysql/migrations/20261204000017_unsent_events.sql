-- An unsent mark carries its row's event count, so that the relay sizes a round from the
-- narrow `outbox_unsent` alone (BENCHMARKS.md, ablation row E11).
--
-- The relay takes the oldest unsent rows until they hold its round's limit of events (a
-- pack holds many). It counted them with a window function over the unsent rows joined
-- to the outbox, which MariaDB ran through three temporary tables, every unsent row
-- written into them on every round while a backlog waited: 0.55 temporary-table writes
-- per durable order under load. Now it reads `(id, attempts, events)` from this table in
-- its key's order, cuts the round itself, and reads the payloads of the rows it kept.
--
-- The order of the steps keeps every count right while instances of the previous
-- version go on inserting: the column first (its default 1 is right for a single event),
-- then the trigger replaced in one statement (no insert finds no trigger), then the
-- packs marked before it got their counts.
ALTER TABLE outbox_unsent
    ADD COLUMN events INT NOT NULL DEFAULT 1 COMMENT 'outbox.events of the row: 1, or a pack''s count';

CREATE OR REPLACE TRIGGER outbox_starts_unsent AFTER INSERT ON outbox FOR EACH ROW
    INSERT INTO outbox_unsent (id, events) VALUES (NEW.id, NEW.events);

UPDATE outbox_unsent u JOIN outbox o ON o.id = u.id
    SET u.events = o.events WHERE u.events <> o.events;
