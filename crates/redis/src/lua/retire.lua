-- Retires a product's gate state before the ledger gives the product back from ledger
-- mode. The entry may be the one from before the switch, which the ledger has sold past:
-- it must no longer vouch that a request never held units (`fresh`, see load.lua: a
-- replay of an order the ledger sold would be refused), nor grant or keep sold-out leases
-- (`lease` deleted, `retired` set, and a revocation published, as rebuild.lua does). The
-- rebuild that follows the way back replaces the whole entry; until then the entry only
-- takes holds that the ledger refuses (another generation). Nothing else changes.
-- KEYS[1] inventory hash  ARGV[1] revocation channel  ARGV[2] product id
-- Returns 1 retired | 0 no entry (nothing to retire).
if not ARGV[1] or ARGV[1] == '' or not tonumber(ARGV[2]) then
  return redis.error_reply('ERR flashsale retire: invalid arguments')
end
local gen = redis.call('HGET', KEYS[1], 'gen')
if not gen then return 0 end
redis.call('HDEL', KEYS[1], 'fresh', 'lease')
-- Until the rebuild replaces the whole entry, reserve.lua grants no new lease on it.
redis.call('HSET', KEYS[1], 'retired', 1)
redis.call('PUBLISH', ARGV[1], ARGV[2] .. ':' .. gen)
return 1
