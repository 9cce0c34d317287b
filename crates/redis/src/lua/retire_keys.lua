-- Deletes the keys a SCAN found under a retired sale's hash tag (after retire_sale.lua):
-- hold records, release, restock and destock markers, rate cells. While the product has
-- no entry, every one is of a retired life and goes. Once it has one again (loaded in a
-- newer generation), only hold records of the retired generation or older go: a marker
-- may then be the new life's, and keeps a retried restock or release from counting twice.
-- KEYS[1] inventory hash  KEYS[2..] the keys found  ARGV[1] the retired generation
-- Returns how many keys were deleted.
local retired = tonumber(ARGV[1])
if not retired or retired < 1 or retired % 1 ~= 0 then
  return redis.error_reply('ERR flashsale retire_keys: invalid arguments')
end
local reloaded = redis.call('EXISTS', KEYS[1]) == 1
local deleted = 0
for i = 2, #KEYS do
  local k = KEYS[i]
  local go = not reloaded
  if reloaded and redis.call('TYPE', k).ok == 'hash' then
    local g = tonumber(redis.call('HGET', k, 'g') or '')
    go = g ~= nil and g <= retired
  end
  if go and k ~= KEYS[1] then deleted = deleted + redis.call('DEL', k) end
end
return deleted
