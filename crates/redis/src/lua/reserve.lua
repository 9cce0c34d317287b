-- Atomic, idempotent check-and-reserve of a batch of purchases of one product, each as
-- if it ran alone, in order.
-- KEYS[1] inventory hash {avail, seq, gen}  KEYS[2] per-user held units (user -> units)
-- KEYS[3] pending holds (zset request_id -> ms)  KEYS[3+i] hold record of purchase i
-- KEYS[3+n+i] (only with the shared rate on) purchase i's user's rate cell
-- ARGV[1] record ttl ms  ARGV[2] sold-out lease ms (0 = none)  ARGV[3] the shared
-- per-user rate's interval in µs (0 = off)  ARGV[4] its burst tolerance in µs; then for
-- purchase i, ARGV[4i+1..4i+4]: quantity, user_id, per-user limit (0 = none), request_id
-- A hold's time is Redis's own clock (TIME), so every instance ages holds on one clock:
-- one instance with a wrong clock can't make recovery think a fresh hold is stale.
-- Returns one string: each purchase's reply, its integers in decimal joined by ',', the
-- replies in order joined by ' ' (one bulk string, not an array of arrays: the client
-- reads one value instead of four or more per purchase, which cost redis-rs's reply
-- parser about 4,600 instructions per order). A reply is
-- 1,hold_id,gen reserved | 0,unseen sold out
--   | 0,unseen,lease ms left,gen,holds sold out under a sold-out lease
--   | -1 not loaded | -2,unseen limit exceeded
--   | -3 the entry was written by another Redis process (see below)
--   | -4,ms over the user's shared rate: retry after ms (see below)
--   | 2,hold_id,user_id,quantity,released 0/1,gen a hold exists for this request.
-- `unseen` is 1 when the gate can vouch that the request_id never held units of the
-- product: it has no record of it in any generation, and every record ever written for
-- the product still exists (`fresh`: loaded by this very Redis process, never rebuilt,
-- less than a record's lifetime ago, and Redis never evicts keys). The caller may then
-- refuse without asking the ledger whether it is a replay of an accepted purchase.
-- The sold-out lease (`lease` in the entry, ms on Redis's clock): a purchase that finds
-- no unit left grants one, and until it ends no purchase is granted a hold. Units that
-- come back end it at once: every script that adds units (release, restock, adjust,
-- rebuild) deletes `lease` and publishes a revocation on the instances' channel in the
-- same atomic step. An instance that heard the lease may refuse purchases itself until
-- it ends or is revoked (app/src/sold_out.rs); `holds` (the entry's `seq`) tells it
-- whether holds were granted since it last listed the product's holders.
-- Every argument is validated before the first write: Redis does not roll back a script
-- that fails halfway.
-- The shared per-user rate (FLASHSALE_USER_PURCHASE_RATE_SCOPE=shared): one GCRA cell
-- per user of the product, under the product's hash tag so it lives in the script's
-- slot, holding `t` the theoretical arrival time of the user's next attempt (µs, Redis's
-- clock) and `r` the request_id it last admitted. An attempt passes while `t` is at most
-- the tolerance ahead of now, and moves it one interval on; the same request_id again
-- (a client retry after a lost reply, the script run twice) is not charged again. A
-- replay of a hold is answered before the cell is looked at. Every instance reaches the
-- same cell, so the limit holds across instances with no extra round trip.
local ttl, lease_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local rate_us, tolerance_us = tonumber(ARGV[3]), tonumber(ARGV[4])
local n = (#ARGV - 4) / 4
-- An integer in decimal, whole digits (`..` and `tostring` write 1e+14 from 10^14 on).
local function d(x) return string.format('%d', x) end
if not lifetime_ok(ttl) or not lease_ms or lease_ms < 0 or lease_ms % 1 ~= 0 or not rate_us
   or rate_us < 0 or rate_us % 1 ~= 0 or not tolerance_us or tolerance_us < 0
   or tolerance_us % 1 ~= 0 or n < 1 or n % 1 ~= 0
   or #KEYS ~= 3 + (rate_us > 0 and 2 or 1) * n then
  return redis.error_reply('ERR flashsale reserve: invalid arguments')
end
for i = 1, n do
  local a = 4 * i + 1
  local q, limit = tonumber(ARGV[a]), tonumber(ARGV[a + 2])
  if not q or q < 1 or q % 1 ~= 0 or not tonumber(ARGV[a + 1]) or not limit or limit < 0
     or not ARGV[a + 3] or ARGV[a + 3] == '' then
    return redis.error_reply('ERR flashsale reserve: invalid arguments')
  end
end
local replies = {}
local inv = redis.call('HMGET', KEYS[1], 'avail', 'gen', 'lease', 'seq', 'srv', 'retired')
local avail = tonumber(inv[1])
if not avail then
  for i = 1, n do replies[i] = '-1' end
  return table.concat(replies, ' ')
end
-- A Redis process that neither loaded nor rebuilt the entry (restarted from a snapshot,
-- a promoted replica) may be behind: its records and its sold-out lease may be gone, so
-- it answers nothing until the gate watch has rebuilt the entry from the ledger (which
-- revokes every lease of the lost state, see rebuild.lua).
local srv = stamp()
if inv[5] and srv ~= inv[5] then
  for i = 1, n do replies[i] = '-3' end
  return table.concat(replies, ' ')
end
local gen = inv[2] or '1'
local now, now_us
local function clock()
  if not now then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now = math.floor(now_us / 1000)
  end
  return now
end
-- Whether purchase i is over its user's shared rate (then `wait` is the ms until it
-- would pass, and nothing is written); a purchase that passes is charged.
local wait
local function throttled(i, rid)
  local cell = KEYS[3 + n + i]
  local c = redis.call('HMGET', cell, 't', 'r')
  if c[2] == rid then return false end
  clock()
  local tat = math.max(tonumber(c[1] or '0') or 0, now_us)
  if tat - now_us > tolerance_us then
    wait = math.ceil((tat - now_us - tolerance_us) / 1000)
    return true
  end
  tat = tat + rate_us
  redis.call('HSET', cell, 't', string.format('%d', tat), 'r', rid)
  redis.call('PEXPIRE', cell, math.ceil((tat - now_us) / 1000) + 1)
  return false
end
-- Until when no hold is granted (ms); nil when no lease is in force.
local leased = tonumber(inv[3])
-- Holds granted in this generation so far (hold ids count up from 1).
local seq = tonumber(inv[4]) or 0
if leased and leased <= clock() then leased = nil end
local stamped = false
local vouch
-- Whether a refusal without a record can vouch for it (see above); computed once.
local function fresh()
  if vouch == nil then
    vouch = false
    local f = tonumber(redis.call('HGET', KEYS[1], 'fresh') or '')
    if f then
      local t = clock()
      local policy = string.match(redis.call('INFO', 'memory'), 'maxmemory_policy:([%w-]+)')
      vouch = t < f and srv ~= nil and srv == inv[5] and policy == 'noeviction'
    end
  end
  return vouch
end
-- Units each user of the batch holds: read once per user, plus what the batch granted.
local held_before, held_added = {}, {}
local function held(user)
  if held_before[user] == nil then
    held_before[user] = tonumber(redis.call('HGET', KEYS[2], user) or '0')
  end
  return held_before[user] + (held_added[user] or 0)
end
-- Holds granted, decided first and written after, in batch order.
local granted = {}
-- The same by record key: a request_id twice in one batch (a client retry queued beside
-- its first attempt) finds the hold the first copy got, as it would in a later call.
local granted_key = {}
for i = 1, n do
  local a = 4 * i + 1
  local q, user, limit, rid = tonumber(ARGV[a]), ARGV[a + 1], tonumber(ARGV[a + 2]), ARGV[a + 3]
  local same = granted_key[KEYS[3 + i]]
  local rec = same and {} or redis.call('HMGET', KEYS[3 + i], 'u', 'q', 's', 'h', 'g')
  -- A record from an older generation belongs to state that was lost and rebuilt without
  -- it: it holds nothing now, and the request may reserve afresh.
  if same then
    -- As the record would give them, whole digits.
    replies[i] = '2,' .. d(same.hold) .. ',' .. same.user .. ',' .. d(same.q) .. ',0,' .. gen
  elseif rec[1] and (rec[5] or '1') == gen then
    -- The record's ids as it keeps them, text (a Lua number is a double and would round
    -- ids above 2^53). A field missing from a damaged record leaves its place empty: the
    -- client reads that purchase's reply as malformed, the others as they are.
    replies[i] = '2,' .. (rec[4] or '') .. ',' .. rec[1] .. ',' .. (rec[2] or '') .. ','
      .. (rec[3] == 'r' and '1' or '0') .. ',' .. gen
  elseif rate_us > 0 and throttled(i, rid) then
    replies[i] = '-4,' .. d(wait)
  elseif leased or avail < q then
    -- A retired entry (retire.lua: the ledger is about to give the product back) grants
    -- no lease: its count may be one the ledger has sold past.
    if not leased and avail == 0 and lease_ms > 0 and not inv[6] then
      leased = clock() + lease_ms
      redis.call('HSET', KEYS[1], 'lease', leased)
    end
    local unseen = (not rec[1] and fresh()) and 1 or 0
    if leased then
      replies[i] = '0,' .. unseen .. ',' .. d(leased - clock()) .. ',' .. gen .. ',' .. d(seq)
    else
      replies[i] = '0,' .. unseen
    end
  else
    local counted = 0
    local over = false
    if limit > 0 then
      over = held(user) + q > limit
      counted = 1
    end
    if over then
      replies[i] = (not rec[1] and fresh()) and '-2,1' or '-2,0'
    else
      if not stamped then
        stamped = true
        clock()
        -- The records written now live `ttl`: the entry vouches no longer than the load
        -- time plus the shortest lifetime any record got (the setting may have changed).
        local lf = redis.call('HMGET', KEYS[1], 'loaded', 'fresh')
        local loaded, f = tonumber(lf[1]), tonumber(lf[2])
        if f and (not loaded or loaded + ttl < f) then
          redis.call('HSET', KEYS[1], 'fresh', loaded and loaded + ttl or 0)
        end
      end
      avail = avail - q
      seq = seq + 1
      if counted == 1 then held_added[user] = (held_added[user] or 0) + q end
      local g = {key = KEYS[3 + i], hold = seq, counted = counted, user = user, q = q,
        rid = rid, stale = rec[1] and true or false}
      granted[#granted + 1] = g
      granted_key[g.key] = g
      replies[i] = '1,' .. d(seq) .. ',' .. gen
    end
  end
end
if #granted == 0 then
  return table.concat(replies, ' ')
end
-- The counters first, once for the whole batch, then the records: should a write fail
-- halfway (Redis does not roll a script back), units are missing from `avail` rather
-- than granted twice, and no hold id is ever handed out again; recovery reconciles
-- holds without a record from the ledger, as it does after a crash.
redis.call('HSET', KEYS[1], 'avail', avail, 'seq', seq)
for user, q in pairs(held_added) do
  redis.call('HINCRBY', KEYS[2], user, q)
end
-- Pending index members, all at once (at most 2 x RESERVE_BATCH_MAX arguments, far below
-- what `unpack` can pass).
local pending = {}
for _, g in ipairs(granted) do
  -- An older generation's record: replaced whole, not merged into. (`rec[1]` is false,
  -- not nil, for a key HMGET did not find: `stale` is true only for a record that exists.)
  if g.stale then
    redis.call('DEL', g.key)
  end
  -- The hold's time is kept only in the pending index (its score).
  redis.call('HSET', g.key, 'u', g.user, 'q', g.q, 's', 'h', 'h', g.hold, 'c', g.counted,
    'g', gen)
  redis.call('PEXPIRE', g.key, ttl)
  pending[#pending + 1] = now
  pending[#pending + 1] = g.rid
end
redis.call('ZADD', KEYS[3], unpack(pending))
return table.concat(replies, ' ')
