-- Gives a hold's units back, at most once.
-- KEYS[1] inventory hash  KEYS[2] per-user held units  KEYS[3] hold record
-- KEYS[4] pending holds   KEYS[5] release marker of this request's reservation
-- ARGV[1] request_id  ARGV[2] release generation (0: a hold the ledger never counted —
-- its own generation decides)  ARGV[3] user_id  ARGV[4] quantity  ARGV[5] limited 0/1
-- ARGV[6] record ttl ms  ARGV[7] the hold's id  ARGV[8] the generation it was taken in
-- ARGV[9] revocation channel  ARGV[10] product id  ARGV[11] units back on sale 1/0 (0: a
-- refund that withdrew them from stock; the hold and the buyer's count are still let go)
-- Returns 1 released | 0 nothing to add (already released, or a rebuild counted the
-- units) | -1 no record of this hold | -2 not loaded, written by another Redis process,
-- or behind the release's generation (retry after the rebuild).
-- Units given back end the product's sold-out lease, and a revocation is published (see
-- reserve.lua).
local relgen = tonumber(ARGV[2])
local ttl = tonumber(ARGV[6])
local hold = tonumber(ARGV[7])
local hgen = tonumber(ARGV[8])
if not relgen or relgen < 0 or not lifetime_ok(ttl) or not hold or not hgen or not ARGV[9]
   or ARGV[9] == '' or not tonumber(ARGV[10]) or (ARGV[11] ~= '1' and ARGV[11] ~= '0')
   or (ARGV[11] == '0' and relgen == 0) then
  return redis.error_reply('ERR flashsale release: invalid arguments')
end
local inv = redis.call('HMGET', KEYS[1], 'avail', 'gen', 'srv')
-- Without the inventory entry HINCRBY would create one holding just these units.
if not inv[1] then return -2 end
-- An entry another process wrote changes only once rebuilt or adopted (stamp.lua): a
-- release taken here and then lost with a failover could not be told from one never made.
if inv[3] and inv[3] ~= stamp() then return -2 end
local gen = tonumber(inv[2] or '1')
local rec = redis.call('HMGET', KEYS[3], 'u', 'q', 's', 'c', 'g', 'h')
-- The record under the request_id is this hold's only if its id and generation match:
-- a later attempt of the same request_id may have taken another hold since (after a
-- rebuild, or after this one's record expired), and that hold has its own release.
local mine = rec[1] ~= false and rec[1] ~= nil and tonumber(rec[6]) == hold
  and tonumber(rec[5] or '1') == hgen
local user, q, counted
if relgen == 0 then
  -- A hold the ledger never counted took its units in its own generation.
  if gen < hgen then return -2 end
  if gen > hgen then
    -- A rebuild since counted stock without it: there is nothing to give back.
    if mine and rec[3] ~= 'r' then
      redis.call('HSET', KEYS[3], 's', 'r')
      redis.call('ZREM', KEYS[4], ARGV[1])
    end
    return 0
  end
  if not mine then return -1 end
  if rec[3] == 'r' then return 0 end
  user, q, counted = rec[1], tonumber(rec[2]), rec[4] == '1'
else
  -- A reservation the ledger counted. Its own marker records that its units came
  -- back: the hold record is not enough, as a later attempt of the same request_id may
  -- replace it (in a later generation) with a hold of its own.
  user, q, counted = ARGV[3], tonumber(ARGV[4]), ARGV[5] == '1'
  if not tonumber(user) or not q then
    return redis.error_reply('ERR flashsale release: invalid arguments')
  end
  if gen < relgen then return -2 end
  if redis.call('EXISTS', KEYS[5]) == 1 then return 0 end
  if mine and rec[3] == 'r' then return 0 end
  if gen > relgen then
    -- A rebuild after the release counted its units as available already.
    if mine then
      redis.call('HSET', KEYS[3], 's', 'r')
      redis.call('ZREM', KEYS[4], ARGV[1])
    end
    return 0
  end
end
if not q or q < 1 then return redis.error_reply('ERR flashsale release: corrupt hold record') end
if ARGV[11] == '1' then
  redis.call('HINCRBY', KEYS[1], 'avail', q)
  if redis.call('HDEL', KEYS[1], 'lease') == 1 then
    redis.call('PUBLISH', ARGV[9], ARGV[10] .. ':' .. (inv[2] or '1'))
  end
end
if counted then
  local left = redis.call('HINCRBY', KEYS[2], user, -q)
  if left <= 0 then redis.call('HDEL', KEYS[2], user) end
end
if mine then
  redis.call('HSET', KEYS[3], 's', 'r')
  -- The pending entry is this hold's; another hold's stays for recovery.
  redis.call('ZREM', KEYS[4], ARGV[1])
end
if relgen > 0 then redis.call('SET', KEYS[5], '1', 'PX', ttl) end
return 1
