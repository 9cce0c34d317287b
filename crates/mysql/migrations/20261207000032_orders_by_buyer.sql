-- A buyer's orders, newest first, a page at a time (GET /v1/orders): one range read of
-- this index backwards from the page's cursor, since InnoDB appends the primary key to
-- every secondary index, so the entries of one user are in id order. It costs one index
-- entry per order written; without it a buyer's page would scan every order of every
-- product, as no other index starts with user_id (migration …15 made the per-user
-- limit's index (product_id, user_id)).
ALTER TABLE orders ADD KEY idx_orders_user (user_id);
