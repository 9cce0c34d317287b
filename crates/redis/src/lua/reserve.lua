-- Atomic, idempotent check-and-reserve of one purchase.
-- KEYS[1] inventory hash {avail, seq, gen}  KEYS[2] per-user held units (user -> units)
-- KEYS[3] hold record of this request      KEYS[4] pending holds (zset request_id -> ms)
-- ARGV[1] quantity  ARGV[2] user_id  ARGV[3] per-user limit (0 = none)
-- ARGV[4] record ttl ms  ARGV[5] request_id
-- A hold's time is Redis's own clock (TIME), so every instance ages holds on one clock:
-- one instance with a wrong clock can't make recovery think a fresh hold is stale.
-- Returns {1, hold_id, gen} reserved | {0} sold out | {-1} not loaded | {-2} limit exceeded
--       | {2, hold_id, user_id, quantity, released 0/1, gen} a hold exists for this request.
-- Everything is validated before the first write: Redis does not roll back a script
-- that fails halfway.
local inv = redis.call('HMGET', KEYS[1], 'avail', 'gen')
local avail = tonumber(inv[1])
if not avail then return {-1} end
local gen = inv[2] or '1'
local rec = redis.call('HMGET', KEYS[3], 'u', 'q', 's', 'h', 'g')
-- A record from an older generation belongs to state that was lost and rebuilt without
-- it: it holds nothing now, and the request may reserve afresh.
if rec[1] and (rec[5] or '1') == gen then
  -- Ids go back as strings: a Lua number is a double and would round ids above 2^53.
  return {2, rec[4], rec[1], rec[2], rec[3] == 'r' and 1 or 0, gen}
end
local q = tonumber(ARGV[1])
local limit = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
if not q or q < 1 or q % 1 ~= 0 or not tonumber(ARGV[2]) or not limit or limit < 0
   or not ttl or ttl < 1 or not ARGV[5] or ARGV[5] == '' then
  return redis.error_reply('ERR flashsale reserve: invalid arguments')
end
if avail < q then return {0} end
local counted = 0
if limit > 0 then
  local held = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
  if held + q > limit then return {-2} end
  counted = 1
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('HINCRBY', KEYS[1], 'avail', -q)
local hold = redis.call('HINCRBY', KEYS[1], 'seq', 1)
if counted == 1 then redis.call('HINCRBY', KEYS[2], ARGV[2], q) end
redis.call('DEL', KEYS[3])
redis.call('HSET', KEYS[3], 'u', ARGV[2], 'q', q, 's', 'h', 'h', hold, 'c', counted, 't', now, 'g', gen)
redis.call('PEXPIRE', KEYS[3], ttl)
redis.call('ZADD', KEYS[4], now, ARGV[5])
return {1, hold, gen}
