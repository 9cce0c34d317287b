-- Gives a hold's units back, at most once.
-- KEYS[1] inventory hash  KEYS[2] per-user held units  KEYS[3] hold record
-- KEYS[4] pending holds   KEYS[5] release marker of this request's reservation
-- ARGV[1] request_id  ARGV[2] release generation (0: a hold the ledger never counted —
-- its own record and generation decide)  ARGV[3] user_id  ARGV[4] quantity
-- ARGV[5] limited 0/1  ARGV[6] record ttl ms  ARGV[7] the reservation's hold id
-- Returns 1 released | 0 nothing to add (already released, or a rebuild counted the
-- units) | -1 no hold record | -2 not loaded, or the gate is behind the release's
-- generation (retry after the rebuild).
local relgen = tonumber(ARGV[2])
local ttl = tonumber(ARGV[6])
if not relgen or relgen < 0 or not ttl or ttl < 1 then
  return redis.error_reply('ERR flashsale release: invalid arguments')
end
local inv = redis.call('HMGET', KEYS[1], 'avail', 'gen')
-- Without the inventory entry HINCRBY would create one holding just these units.
if not inv[1] then return -2 end
local gen = tonumber(inv[2] or '1')
local rec = redis.call('HMGET', KEYS[3], 'u', 'q', 's', 'c', 'g', 'h')
local user, q, counted, mine
if relgen == 0 then
  if not rec[1] then return -1 end
  if rec[3] == 'r' then return 0 end
  -- A hold the ledger never counted took its units in its own generation; after a
  -- rebuild those units are already available.
  if tonumber(rec[5] or '1') ~= gen then
    redis.call('HSET', KEYS[3], 's', 'r')
    redis.call('ZREM', KEYS[4], ARGV[1])
    return 0
  end
  user, q, counted, mine = rec[1], tonumber(rec[2]), rec[4] == '1', true
else
  -- A reservation the ledger counted. The record under its request_id may belong to
  -- another hold (a later attempt of the same request_id after this one's record was
  -- lost or expired): only a record of this very hold marks this release; otherwise a
  -- marker of its own does, and the other hold's record is left to its own release.
  local hold = tonumber(ARGV[7])
  user, q, counted = ARGV[3], tonumber(ARGV[4]), ARGV[5] == '1'
  if not hold or not tonumber(user) or not q then
    return redis.error_reply('ERR flashsale release: invalid arguments')
  end
  mine = rec[1] ~= false and rec[1] ~= nil and tonumber(rec[6]) == hold
  if gen < relgen then return -2 end
  if mine and rec[3] == 'r' then return 0 end
  if not mine and redis.call('EXISTS', KEYS[5]) == 1 then return 0 end
  if gen > relgen then
    -- A rebuild after the release counted its units as available already.
    if mine then redis.call('HSET', KEYS[3], 's', 'r') end
    redis.call('ZREM', KEYS[4], ARGV[1])
    return 0
  end
end
if not q or q < 1 then return redis.error_reply('ERR flashsale release: corrupt hold record') end
redis.call('HINCRBY', KEYS[1], 'avail', q)
if counted then
  local left = redis.call('HINCRBY', KEYS[2], user, -q)
  if left <= 0 then redis.call('HDEL', KEYS[2], user) end
end
if mine then
  redis.call('HSET', KEYS[3], 's', 'r')
else
  redis.call('SET', KEYS[5], '1', 'PX', ttl)
end
redis.call('ZREM', KEYS[4], ARGV[1])
return 1
