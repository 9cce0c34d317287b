-- Gives a hold's units back, at most once per hold.
-- KEYS[1] inventory hash  KEYS[2] per-user held units  KEYS[3] hold record
-- KEYS[4] pending holds   ARGV[1] request_id
-- Returns 1 released | 0 already released | -1 no hold record | -2 stock not loaded.
local rec = redis.call('HMGET', KEYS[3], 'u', 'q', 's', 'c')
if not rec[1] then return -1 end
if rec[3] == 'r' then return 0 end
local q = tonumber(rec[2])
if not q or q < 1 then return redis.error_reply('ERR flashsale release: corrupt hold record') end
-- Without the inventory entry HINCRBY would create one holding just these units.
if not redis.call('HGET', KEYS[1], 'avail') then return -2 end
redis.call('HINCRBY', KEYS[1], 'avail', q)
if rec[4] == '1' then
  local left = redis.call('HINCRBY', KEYS[2], rec[1], -q)
  if left <= 0 then redis.call('HDEL', KEYS[2], rec[1]) end
end
redis.call('HSET', KEYS[3], 's', 'r')
redis.call('ZREM', KEYS[4], ARGV[1])
return 1
