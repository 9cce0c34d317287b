-- Fewer secondary indexes on the two rows every purchase inserts (BENCHMARKS.md,
-- ablation row L25). Each entry is work on every insert and on every change of its
-- columns.
--
-- inventory_reservation.idx_reservation_status (status, updated_at) serves no query: the
-- returns still owed to the gate are found by idx_reservation_return (stock_returned,
-- status), a product's reservations by uk_reservation_hold (product_id, generation,
-- hold_id), and everything else reads reservations by request_id.
ALTER TABLE inventory_reservation DROP KEY idx_reservation_status;

-- orders had one index on user_id (the per-user limit's sum, by user and product) and one
-- on (product_id, status) (the audit's per-product reads, the rebuild of a product's
-- per-user counts). One index on (product_id, user_id) serves all of them: the per-user
-- sum by both its columns, the product's reads by its first. Expiry reads
-- idx_orders_status_expires, a buyer's order its primary key.
ALTER TABLE orders
    DROP KEY idx_orders_user,
    DROP KEY idx_orders_product_status,
    ADD KEY idx_orders_product_user (product_id, user_id);
