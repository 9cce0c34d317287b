-- Replaces a product's gate state with one computed from the ledger's facts, in a new
-- generation. Refuses to go back to an older or equal generation, so two instances
-- rebuilding at once can't leave the older result in place.
-- KEYS[1] inventory hash  KEYS[2] per-user held units  KEYS[3] pending holds
-- ARGV[1] generation  ARGV[2] available  ARGV[3] next hold id base  ARGV[4] sold-out
-- lease ms  ARGV[5..] user, units pairs
-- Returns 1 rebuilt | 0 refused (gate already at this generation or newer).
-- `srv` records which Redis process wrote the entry (see state.lua). A rebuilt entry has
-- no `fresh` (see load.lua): the records of the lost state are gone, so a refusal can no
-- longer vouch that a request never held units. A rebuilt entry starts under a sold-out
-- lease (see reserve.lua): the lost state may have granted one that instances still
-- trust, so no hold is granted before any such lease has ended.
local gen = tonumber(ARGV[1])
local avail = tonumber(ARGV[2])
local seq = tonumber(ARGV[3])
local lease_ms = tonumber(ARGV[4])
if not gen or gen < 1 or not avail or avail < 0 or not seq or seq < 0 or not lease_ms
   or lease_ms < 0 or (#ARGV - 4) % 2 ~= 0 then
  return redis.error_reply('ERR flashsale rebuild: invalid arguments')
end
for i = 5, #ARGV, 2 do
  if not tonumber(ARGV[i]) or not tonumber(ARGV[i + 1]) then
    return redis.error_reply('ERR flashsale rebuild: invalid user counts')
  end
end
local srv = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if not srv then return redis.error_reply('ERR flashsale rebuild: no run_id in INFO') end
local current = tonumber(redis.call('HGET', KEYS[1], 'gen') or '0')
if current >= gen then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'avail', avail, 'seq', seq, 'gen', gen, 'srv', srv)
if lease_ms > 0 then
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[1], 'lease',
    tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + lease_ms)
end
for i = 5, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
return 1
