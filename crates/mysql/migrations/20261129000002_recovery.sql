-- Problems recovery could not resolve by itself, for an operator. Recovery never guesses
-- an unknown outcome: after a bounded number of tries it records one row here (and logs
-- at error level) and leaves the stock where it is.
CREATE TABLE recovery_incident (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    request_id   VARCHAR(64)  NOT NULL,
    product_id   BIGINT       NOT NULL,
    kind         VARCHAR(32)  NOT NULL,
    detail       VARCHAR(1000) NOT NULL,
    created_at   DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    resolved_at  DATETIME(6)  NULL,
    UNIQUE KEY uk_incident (request_id, kind),
    KEY idx_incident_open (resolved_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
