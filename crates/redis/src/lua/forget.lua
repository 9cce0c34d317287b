-- Takes holds the ledger accounts for out of the pending index, each only while the
-- record under its request_id is still that very hold (or is gone): a later attempt of
-- the same request_id may have taken another hold since, and recovery still needs that
-- one's entry.
-- KEYS[1] pending holds  KEYS[2..n] the hold records
-- ARGV request_id, hold id, generation for each record, in KEYS order; hold id and
-- generation 0, which no hold has, take the entry out only while its record is gone
-- Returns how many entries it removed.
if #ARGV ~= (#KEYS - 1) * 3 then
  return redis.error_reply('ERR flashsale forget: arguments do not match the keys')
end
-- The entries to remove, in one ZREM: at most the trimmer's batch (2,048 ids) or a
-- recovery pass's (500), far below what `unpack` can pass.
local members = {}
for i = 2, #KEYS do
  local a = (i - 2) * 3
  local rec = redis.call('HMGET', KEYS[i], 'h', 'g')
  if not rec[1] or (tonumber(rec[1]) == tonumber(ARGV[a + 2])
      and tonumber(rec[2] or '1') == tonumber(ARGV[a + 3])) then
    members[#members + 1] = ARGV[a + 1]
  end
end
if #members == 0 then
  return 0
end
return redis.call('ZREM', KEYS[1], unpack(members))
