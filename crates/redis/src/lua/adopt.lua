-- Takes over a stock entry another Redis process wrote, once the gate has proven that
-- the entry arrived whole: its writer is still a healthy primary with the same stamp,
-- so the slot was migrated to this process, not lost with a failover or a restart
-- (lib.rs, "Lost state and resharding"). Until then every script that would change the
-- entry refused it, so it is exactly what its writer handed over.
-- KEYS[1] inventory hash  ARGV[1] the writer's stamp the proof was made for
-- Returns 1 adopted (also when this process already had: a retry after a lost reply)
--   | 0 the entry is gone, or its stamp is no longer ARGV[1] (decide again).
if not ARGV[1] or ARGV[1] == '' then
  return redis.error_reply('ERR flashsale adopt: invalid arguments')
end
local mine = stamp()
if not mine then return redis.error_reply('ERR flashsale adopt: no run_id in INFO') end
local srv = redis.call('HGET', KEYS[1], 'srv')
if srv == mine then return 1 end
if srv ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'srv', mine)
return 1
