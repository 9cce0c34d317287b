-- Replaces a product's gate state with one computed from the ledger's facts, in a new
-- generation. Refuses to go back to an older or equal generation, so two instances
-- rebuilding at once can't leave the older result in place.
-- KEYS[1] inventory hash  KEYS[2] per-user held units  KEYS[3] pending holds
-- ARGV[1] generation  ARGV[2] available  ARGV[3] next hold id base  ARGV[4] revocation
-- channel  ARGV[5] product id  ARGV[6..] user, units pairs
-- Returns 1 rebuilt | 0 refused (gate already at this generation or newer).
-- `srv` records which Redis process wrote the entry (see stamp.lua). A rebuilt entry has
-- no `fresh` (see load.lua): the records of the lost state are gone, so a refusal can no
-- longer vouch that a request never held units.
-- The lost state may have granted a sold-out lease that instances still trust. The
-- rebuild revokes it at once rather than waiting it out (no lease on the new entry, a
-- revocation published), which is safe: an instance trusts a lease only while its
-- subscription to revocations is live, and forgets every lease when it is lost
-- (app/src/sold_out.rs). So an instance still subscribed to this Redis process (the
-- state was lost without a restart: keys deleted or evicted) hears this revocation; one
-- whose subscription broke with the old process (a restart, a failover) forgot its
-- leases when it noticed, and trusts no lease heard before it subscribed here. Only an
-- instance that has not noticed yet that its subscription died may still refuse, until it notices or its
-- lease ends, whichever is first: the bound of any lost revocation. Waiting the lease
-- out instead would refuse every buyer of every rebuilt product for a whole lease.
local gen = tonumber(ARGV[1])
local avail = tonumber(ARGV[2])
local seq = tonumber(ARGV[3])
if not gen or gen < 1 or not avail or avail < 0 or not seq or seq < 0 or not ARGV[4]
   or ARGV[4] == '' or not tonumber(ARGV[5]) or (#ARGV - 5) % 2 ~= 0 then
  return redis.error_reply('ERR flashsale rebuild: invalid arguments')
end
for i = 6, #ARGV, 2 do
  if not tonumber(ARGV[i]) or not tonumber(ARGV[i + 1]) then
    return redis.error_reply('ERR flashsale rebuild: invalid user counts')
  end
end
local srv = stamp()
if not srv then return redis.error_reply('ERR flashsale rebuild: no run_id in INFO') end
local current = tonumber(redis.call('HGET', KEYS[1], 'gen') or '0')
if current >= gen then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'avail', avail, 'seq', seq, 'gen', gen, 'srv', srv)
for i = 6, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
redis.call('PUBLISH', ARGV[4], ARGV[5] .. ':' .. ARGV[1])
return 1
