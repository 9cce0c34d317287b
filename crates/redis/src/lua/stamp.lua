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
