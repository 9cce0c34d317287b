-- Parked outbox rows: rows the broker refused for good (a message larger than it takes)
-- each time the relay offered them, PARK_AFTER_REFUSALS times in a row
-- (app/src/relay.rs). A parked row leaves the unsent set (its outbox_unsent mark is
-- deleted, so the relay offers it no more and the rows behind it go on) and has a row
-- here instead, kept for an operator: `flashsale events parked list` shows them and
-- `flashsale events parked retry` puts them back to be published. The audit counts them
-- as I7 violations: their events reached no consumer.
--
-- `refusals` counts a row's refusals in a row; any other failure (the broker out of
-- reach, an election) sets it back to 0.
ALTER TABLE outbox_unsent
    ADD COLUMN refusals INT NOT NULL DEFAULT 0 COMMENT 'publishes refused for good in a row';

CREATE TABLE outbox_parked (
    id         BIGINT       NOT NULL PRIMARY KEY COMMENT 'outbox.id of the parked row',
    events     INT          NOT NULL COMMENT 'outbox.events of the row',
    attempts   INT          NOT NULL COMMENT 'failed publish attempts, the last included',
    reason     VARCHAR(255) NOT NULL COMMENT 'the broker''s last refusal',
    parked_at  DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    CONSTRAINT fk_outbox_parked_event FOREIGN KEY (id) REFERENCES outbox (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
