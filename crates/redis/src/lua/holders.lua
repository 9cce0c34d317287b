-- The request_ids in a product's pending index, for an instance's list of the product's
-- holders (app/src/sold_out.rs), with the stock generation they belong to. Only the Redis
-- process that loaded or rebuilt the entry, and one that never evicts keys, can vouch
-- that no hold left the index without the ledger recording it: any other may have lost
-- holds (a restart from a snapshot, a promoted replica).
-- KEYS[1] inventory hash  KEYS[2] pending index  ARGV[1] most request_ids to return
-- Returns {1, gen, id...} | {2, gen} more than ARGV[1] | {-1} not loaded
--   | {-3} another process wrote the entry, or keys may be evicted: no list.
local max = tonumber(ARGV[1])
if not max or max < 0 or max % 1 ~= 0 then
  return redis.error_reply('ERR flashsale holders: invalid arguments')
end
local inv = redis.call('HMGET', KEYS[1], 'avail', 'gen', 'srv')
if not tonumber(inv[1]) then return {-1} end
local srv = stamp()
local policy = string.match(redis.call('INFO', 'memory'), 'maxmemory_policy:([%w-]+)')
if not inv[3] or srv ~= inv[3] or policy ~= 'noeviction' then return {-3} end
local gen = inv[2] or '1'
if redis.call('ZCARD', KEYS[2]) > max then return {2, gen} end
local reply = {1, gen}
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  reply[#reply + 1] = id
end
return reply
