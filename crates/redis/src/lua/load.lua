-- First load of a product's stock (warm-up). Never overwrites an existing count.
-- KEYS[1] inventory hash  ARGV[1] available  ARGV[2] generation  ARGV[3] record ttl ms
-- ARGV[4] 1 when the product never had an entry before (its first generation), else 0
-- Returns 1 loaded | 0 already present.
-- `srv` records which Redis process wrote the entry (see stamp.lua); `fresh` (ms, Redis's
-- clock) is until when every hold record ever written for the product still exists: the
-- product had no sales before this load, and records live `ttl` (see reserve.lua, which
-- brings `fresh` forward if a later record gets a shorter lifetime). A product loaded again
-- after its ended sale was retired (retire_sale.lua deleted its records) gets no `fresh`:
-- a request that held units in an earlier life has no record here any more.
local n = tonumber(ARGV[1])
local gen = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
if not n or n < 0 or n % 1 ~= 0 or not gen or gen < 1 or gen % 1 ~= 0
   or not lifetime_ok(ttl) or (ARGV[4] ~= '1' and ARGV[4] ~= '0') then
  return redis.error_reply('ERR flashsale load: invalid arguments')
end
local srv = stamp()
if not srv then return redis.error_reply('ERR flashsale load: no run_id in INFO') end
if redis.call('HSETNX', KEYS[1], 'avail', n) == 0 then return 0 end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('HSET', KEYS[1], 'seq', 0, 'gen', gen, 'srv', srv, 'loaded', now)
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'fresh', now + ttl) end
return 1
