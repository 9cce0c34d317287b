-- A product's stock entry as the gate watch checks it, read in one step with the stamp
-- of the Redis process serving it (stamp.lua).
-- KEYS[1] inventory hash
-- Returns {} when there is no entry | {avail, seq, gen, changed 0/1, writer}: changed is
-- 1 when another Redis process loaded, rebuilt or adopted the entry (this one restarted
-- from a snapshot, is a promoted replica, or received the slot in a migration), so
-- writes made after the copy may be lost; writer is that process's stamp ('' if none).
local inv = redis.call('HMGET', KEYS[1], 'avail', 'seq', 'gen', 'srv')
if not inv[1] then return {} end
local srv = stamp()
if not srv then return redis.error_reply('ERR flashsale state: no run_id in INFO') end
local changed = inv[4] == srv and 0 or 1
return {inv[1], inv[2] or '0', inv[3] or '1', changed, changed == 1 and (inv[4] or '') or ''}
