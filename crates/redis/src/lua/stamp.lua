-- Prelude of every script (calls.rs prepends it): `stamp()` names the Redis data this
-- process serves, as `run_id:master_replid`. A stock entry records the stamp of the
-- process that loaded, rebuilt or adopted it (`srv`), and a script that finds another
-- stamp there knows the entry may be behind:
--   * a restart from a snapshot or an AOF changes the run_id;
--   * a promoted replica has its own run_id;
--   * a primary that was a replica in between (it failed over and came back) keeps its
--     run_id but got a new replication id when it resynced, and another when it was
--     promoted again.
-- A slot migrated live to another primary also lands under another stamp: the gate
-- tells that case apart and adopts the entry (adopt.lua, lib.rs).
local function stamp()
  local info = redis.call('INFO', 'server', 'replication')
  local run = string.match(info, 'run_id:(%x+)')
  local replid = string.match(info, 'master_replid:(%x+)')
  if run and replid then return run .. ':' .. replid end
  return nil
end

-- The inventory entry (`avail`, `gen`, `srv`) at `key`, for a change recorded in the
-- ledger's generation `gen` (a restock's, a destock's): the entry if this process wrote
-- it and it is in that generation; else nil and why not, as those scripts answer it:
-- -1 not loaded, written by another process (not before it is rebuilt or adopted, see
-- release.lua), or still in an older generation (the rebuild that will count the change
-- has not landed yet: retry after it); -3 a newer generation (a rebuild since the change
-- was recorded counted the ledger's units, and the change must be recorded anew).
local function entry_at(key, gen)
  local inv = redis.call('HMGET', key, 'avail', 'gen', 'srv')
  if not inv[1] or (inv[3] and inv[3] ~= stamp()) then return nil, -1 end
  local current = tonumber(inv[2] or '1')
  if current < gen then return nil, -1 end
  if current > gen then return nil, -3 end
  return inv
end
