-- flashsale's ledger: the business facts every other store is rebuilt from.
-- Times are UTC (every session sets time_zone = '+00:00'), microsecond precision.

CREATE TABLE products (
    product_id      BIGINT       NOT NULL PRIMARY KEY,
    name            VARCHAR(200) NOT NULL,
    per_user_limit  INT UNSIGNED NULL COMMENT 'most units one user may hold; NULL = no limit',
    sale_starts_at  DATETIME(6)  NULL,
    sale_ends_at    DATETIME(6)  NULL,
    stock_loaded    TINYINT(1)   NOT NULL DEFAULT 0 COMMENT '1 once the stock gate was loaded',
    created_at      DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    CONSTRAINT chk_products_id CHECK (product_id > 0),
    CONSTRAINT chk_products_window CHECK (sale_starts_at IS NULL OR sale_ends_at IS NULL OR sale_ends_at > sale_starts_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The seeds' inventory table. available + reserved (pre_deduct) + sold = total, always:
-- the CHECK makes a transaction that would break conservation or go negative fail.
CREATE TABLE product_inventory (
    id                BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    product_id        BIGINT      NOT NULL,
    total_stock       BIGINT      NOT NULL,
    available_stock   BIGINT      NOT NULL,
    pre_deduct_stock  BIGINT      NOT NULL DEFAULT 0 COMMENT 'units held by PROCESSING reservations',
    sold_count        BIGINT      NOT NULL DEFAULT 0 COMMENT 'units of CONFIRMED reservations',
    version           BIGINT      NOT NULL DEFAULT 0,
    create_time       DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    update_time       DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    UNIQUE KEY uk_product_id (product_id),
    CONSTRAINT chk_inventory_conservation CHECK (
        available_stock >= 0 AND pre_deduct_stock >= 0 AND sold_count >= 0
        AND available_stock + pre_deduct_stock + sold_count = total_stock)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE orders (
    id             BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    request_id     VARCHAR(64) NOT NULL,
    user_id        BIGINT      NOT NULL,
    product_id     BIGINT      NOT NULL,
    quantity       INT         NOT NULL,
    status         VARCHAR(32) NOT NULL,
    created_at     DATETIME(6) NOT NULL,
    expires_at     DATETIME(6) NOT NULL COMMENT 'unpaid past this (database clock) = expired',
    paid_at        DATETIME(6) NULL,
    cancelled_at   DATETIME(6) NULL,
    cancel_reason  VARCHAR(32) NULL,
    updated_at     DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    UNIQUE KEY uk_request_id (request_id),
    KEY idx_orders_status_expires (status, expires_at),
    KEY idx_orders_product_status (product_id, status),
    KEY idx_orders_user (user_id),
    CONSTRAINT chk_orders_status CHECK (status IN ('PENDING_PAYMENT', 'PAID', 'CANCELLED')),
    CONSTRAINT chk_orders_quantity CHECK (quantity > 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- One row per request_id that ever held stock. Inserted with its order in one
-- transaction, or alone as RELEASED to fence a request that has no order (so a late
-- commit of that request fails on uk_request_id).
CREATE TABLE inventory_reservation (
    id              BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    request_id      VARCHAR(64) NOT NULL,
    product_id      BIGINT      NOT NULL,
    user_id         BIGINT      NOT NULL,
    quantity        INT         NOT NULL,
    hold_id         BIGINT      NOT NULL COMMENT 'the stock gate hold this reservation stands for',
    status          VARCHAR(16) NOT NULL,
    release_reason  VARCHAR(32) NULL,
    stock_returned  TINYINT(1)  NOT NULL DEFAULT 0 COMMENT 'RELEASED: units are back in the stock gate',
    created_at      DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at      DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    resolved_at     DATETIME(6) NULL,
    UNIQUE KEY uk_request_id (request_id),
    KEY idx_reservation_status (status, updated_at),
    KEY idx_reservation_return (stock_returned, status),
    CONSTRAINT chk_reservation_status CHECK (status IN ('PROCESSING', 'CONFIRMED', 'RELEASED')),
    CONSTRAINT chk_reservation_quantity CHECK (quantity > 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- One row per stock movement; (request_id, type) unique so a movement is applied once.
CREATE TABLE inventory_log (
    id           BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    request_id   VARCHAR(64) NOT NULL,
    product_id   BIGINT      NOT NULL,
    order_id     BIGINT      NULL,
    quantity     INT         NOT NULL COMMENT 'units moved; the type says from where to where',
    type         VARCHAR(16) NOT NULL,
    remark       VARCHAR(255) NULL,
    create_time  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    UNIQUE KEY uk_request_type (request_id, type),
    KEY idx_log_product (product_id),
    KEY idx_log_order (order_id),
    CONSTRAINT chk_log_type CHECK (type IN ('reserve', 'confirm', 'release', 'restock'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Restocks by request_id, and whether the stock gate has the units yet.
CREATE TABLE restock_request (
    request_id     VARCHAR(64) NOT NULL PRIMARY KEY,
    product_id     BIGINT      NOT NULL,
    quantity       BIGINT      NOT NULL,
    gate_applied   TINYINT(1)  NOT NULL DEFAULT 0,
    created_at     DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    KEY idx_restock_pending (gate_applied)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
