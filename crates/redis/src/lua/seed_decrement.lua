-- The seed documents' check-and-decrement, as a benchmark baseline: atomic in Redis, but
-- with no hold record, no idempotency and no trace (a retried call takes stock again).
-- KEYS[1] inventory hash  ARGV[1] quantity
-- Returns 1 taken | 0 not enough stock | -1 no stock entry.
local stock = tonumber(redis.call('HGET', KEYS[1], 'avail') or '-1')
local quantity = tonumber(ARGV[1])
if stock < 0 then return -1 end
if stock < quantity then return 0 end
redis.call('HINCRBY', KEYS[1], 'avail', -quantity)
return 1
