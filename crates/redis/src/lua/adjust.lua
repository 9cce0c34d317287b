-- Reconciliation's repair: moves the available count by a delta, never below zero and
-- never creating a count that is not there.
-- KEYS[1] inventory hash  ARGV[1] delta
-- Returns 1 adjusted | 0 refused (would go below zero) | -1 stock not loaded.
local d = tonumber(ARGV[1])
if not d or d % 1 ~= 0 then
  return redis.error_reply('ERR flashsale adjust: invalid delta')
end
local avail = tonumber(redis.call('HGET', KEYS[1], 'avail'))
if not avail then return -1 end
if avail + d < 0 then return 0 end
redis.call('HINCRBY', KEYS[1], 'avail', d)
return 1
