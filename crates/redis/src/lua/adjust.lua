-- Reconciliation's repair: moves the available count by a delta, from the count the
-- repair measured, never below zero and never creating a count that is not there.
-- KEYS[1] inventory hash  ARGV[1] delta  ARGV[2] revocation channel  ARGV[3] product id
-- ARGV[4] the available count the delta was computed from
-- ARGV[5] the stock generation that count was read in
-- ARGV[6] the last hold id handed out when that count was read
-- Applied only while the count is still the measured one, in the measured generation, with
-- no hold taken since (a hold and a return of as many units leave the count as it was):
-- the same call run a second time (a retry after a lost reply) finds the count it left
-- and changes nothing, and a count that moved since the measurement is not repaired from
-- a stale figure. A rebuild or reload since then is a new generation whose count was
-- computed from the ledger afresh, even when it happens to equal the measured one: the
-- delta was measured against the old state, so it is refused there too.
-- Units added end the product's sold-out lease, and a revocation is published (see
-- reserve.lua).
-- Returns 1 adjusted | 0 refused (would go below zero, or the count, the generation or
-- the last hold id moved) | -1 stock not loaded, or written by another Redis process.
local d, from, at = tonumber(ARGV[1]), tonumber(ARGV[4]), tonumber(ARGV[5])
local seq = tonumber(ARGV[6])
if not d or d % 1 ~= 0 or not ARGV[2] or ARGV[2] == '' or not tonumber(ARGV[3])
   or not from or from % 1 ~= 0 or not at or at % 1 ~= 0 or at < 1
   or not seq or seq % 1 ~= 0 or seq < 0 then
  return redis.error_reply('ERR flashsale adjust: invalid arguments')
end
local inv = redis.call('HMGET', KEYS[1], 'avail', 'gen', 'srv', 'seq')
local avail = tonumber(inv[1])
if not avail then return -1 end
-- Another process wrote the entry: not before it is rebuilt or adopted (see release.lua).
if inv[3] and inv[3] ~= stamp() then return -1 end
if avail ~= from or tonumber(inv[2] or '1') ~= at or tonumber(inv[4] or '0') ~= seq
   or avail + d < 0 then
  return 0
end
redis.call('HINCRBY', KEYS[1], 'avail', d)
if d > 0 and redis.call('HDEL', KEYS[1], 'lease') == 1 then
  redis.call('PUBLISH', ARGV[2], ARGV[3] .. ':' .. (inv[2] or '1'))
end
return 1
