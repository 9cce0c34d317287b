-- Takes units off sale once per destock id, only if that many are available, in the
-- generation the destock was recorded in.
-- KEYS[1] inventory hash  KEYS[2] destock marker  ARGV[1] quantity  ARGV[2] generation
-- Returns 1 taken | 0 refused (fewer units available) | -1 stock not loaded, written by
-- another Redis process, or still in an older generation than the destock's (retry after
-- the rebuild) | -3 stale generation (a rebuild since the destock was recorded counted
-- the ledger's units, which do not take it off yet: record it anew and take it again).
-- Held and sold units are not in `avail`, so they are never taken.
local q = tonumber(ARGV[1])
local gen = tonumber(ARGV[2])
if not q or q < 1 or q % 1 ~= 0 or not gen or gen < 1 or gen % 1 ~= 0 then
  return redis.error_reply('ERR flashsale destock: invalid arguments')
end
local inv, refused = entry_at(KEYS[1], gen)
if not inv then return refused end
-- The marker keeps the outcome with its generation, '<outcome>:<generation>', so a retry
-- in the same generation answers what the first call did.
local marker = redis.call('GET', KEYS[2])
if marker then
  local outcome, at = string.match(marker, '^(%d):(%d+)$')
  if not outcome then
    return redis.error_reply('ERR flashsale destock: unreadable marker')
  end
  if tonumber(at) == gen then return tonumber(outcome) end
end
local outcome = 0
if tonumber(inv[1]) >= q then
  redis.call('HINCRBY', KEYS[1], 'avail', -q)
  outcome = 1
end
-- Kept without expiry, as a restock's: destocks are rare admin actions, and the marker
-- is what makes a late retry answer the same.
redis.call('SET', KEYS[2], outcome .. ':' .. gen)
return outcome
