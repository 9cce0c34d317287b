-- An outbox row's payload holds a whole pack: a group commit's `order_created` events of
-- one product (migration …13_batch_facts.sql). A TEXT column holds 65,535 bytes, about
-- 200 events; a batch is up to 256 purchases (GROUP_COMMIT_MAX) of up to 370 bytes of
-- event each, 94,722 bytes. A larger pack failed its INSERT (1406, data too long), and
-- the whole batch with it: every purchase in it answered 503 and had to be retried, just
-- when a hot product's queue was longest. MEDIUMTEXT holds 16 MiB; a single event row
-- is unchanged.
ALTER TABLE outbox
    MODIFY payload MEDIUMTEXT NOT NULL COMMENT 'the message body, JSON (docs/events.md); a pack''s JSON array of events';
