-- A product's stock entry as the gate watch checks it, read in one step with the run id
-- of the Redis process serving it.
-- KEYS[1] inventory hash
-- Returns {} when there is no entry | {avail, seq, gen, changed 0/1}: changed is 1 when
-- the entry was loaded or rebuilt by another Redis process (this one restarted from a
-- snapshot or is a promoted replica), so writes made after the copy may be lost.
local inv = redis.call('HMGET', KEYS[1], 'avail', 'seq', 'gen', 'srv')
if not inv[1] then return {} end
local srv = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if not srv then return redis.error_reply('ERR flashsale state: no run_id in INFO') end
return {inv[1], inv[2] or '0', inv[3] or '1', inv[4] == srv and 0 or 1}
