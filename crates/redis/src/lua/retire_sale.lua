-- Retires an ended sale's stock entry, after the ledger retired the sale in `generation`
-- (moved the product to the next generation, so no hold of this one can commit, and
-- marked its gate not loaded). Deletes the entry, the per-user counts and the pending
-- index, only while the entry is still of that generation or older: an entry loaded
-- again since (a restock, a window moved into the future) is of a newer generation and
-- stays, with its counts and index. With no entry, the counts and index (if any) are of
-- an older life and go too.
-- KEYS[1] inventory hash  KEYS[2] per-user counts  KEYS[3] pending index
-- ARGV[1] the retired generation
-- Returns 1 deleted | 0 a newer entry kept.
local retired = tonumber(ARGV[1])
if not retired or retired < 1 or retired % 1 ~= 0 then
  return redis.error_reply('ERR flashsale retire_sale: invalid arguments')
end
local gen = redis.call('HGET', KEYS[1], 'gen')
if gen and tonumber(gen) > retired then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return 1
