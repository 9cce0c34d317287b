-- The operator's log records every admin action, creations and restocks too. A restock
-- is logged under its own request_id (the admins' one namespace: a request_id used for a
-- pause cannot name a restock, nor the other way round). A creation has no request_id:
-- the product id is its key, and a retry finds the product. Its line keeps request_id
-- NULL, which the unique key allows any number of times.
ALTER TABLE admin_action MODIFY request_id VARCHAR(64) NULL
    COMMENT 'the admin''s idempotency key; NULL for a creation (keyed by its product)';
