-- First load of a product's stock (warm-up). Never overwrites an existing count.
-- KEYS[1] inventory hash  ARGV[1] available
-- Returns 1 loaded | 0 already present.
local n = tonumber(ARGV[1])
if not n or n < 0 or n % 1 ~= 0 then
  return redis.error_reply('ERR flashsale load: invalid count')
end
if redis.call('HSETNX', KEYS[1], 'avail', n) == 0 then return 0 end
redis.call('HSETNX', KEYS[1], 'seq', 0)
return 1
