-- Adds units once per restock id.
-- KEYS[1] inventory hash  KEYS[2] restock marker  ARGV[1] quantity
-- Returns 1 applied | 0 already applied | -1 stock not loaded.
local q = tonumber(ARGV[1])
if not q or q < 1 or q % 1 ~= 0 then
  return redis.error_reply('ERR flashsale restock: invalid quantity')
end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if not redis.call('HGET', KEYS[1], 'avail') then return -1 end
redis.call('HINCRBY', KEYS[1], 'avail', q)
-- Kept without expiry: restocks are rare admin actions, and the marker is what makes a
-- retried restock a no-op however late it comes.
redis.call('SET', KEYS[2], q)
return 1
