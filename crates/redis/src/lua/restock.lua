-- Adds units once per restock id, in the generation the restock was recorded in.
-- KEYS[1] inventory hash  KEYS[2] restock marker  ARGV[1] quantity  ARGV[2] generation
-- ARGV[3] revocation channel  ARGV[4] product id
-- Returns 1 applied | 0 already applied | -1 stock not loaded, written by another Redis
-- process, or still in an older generation than the restock's (retry after the rebuild) | -3 stale generation (a
-- rebuild since the restock was recorded already counted it).
-- The units end the product's sold-out lease, and a revocation is published (see
-- reserve.lua).
local q = tonumber(ARGV[1])
local gen = tonumber(ARGV[2])
if not q or q < 1 or q % 1 ~= 0 or not gen or not ARGV[3] or ARGV[3] == ''
   or not tonumber(ARGV[4]) then
  return redis.error_reply('ERR flashsale restock: invalid arguments')
end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
-- In an older generation, the rebuild that will count the restock has not landed yet:
-- units added now would be overwritten by it.
local inv, refused = entry_at(KEYS[1], gen)
if not inv then return refused end
redis.call('HINCRBY', KEYS[1], 'avail', q)
if redis.call('HDEL', KEYS[1], 'lease') == 1 then
  redis.call('PUBLISH', ARGV[3], ARGV[4] .. ':' .. (inv[2] or '1'))
end
-- Kept without expiry: restocks are rare admin actions, and the marker is what makes a
-- retried restock a no-op however late it comes.
redis.call('SET', KEYS[2], q)
return 1
