-- redis-lock's release (a benchmark baseline only, `flashsale_app::baseline`): deletes
-- the product's lock only while it still holds the caller's token. A holder whose lease
-- ran out must not delete the lock another buyer took since (Redisson's unlock, and
-- the Redis documentation's pattern for SET NX locks).
-- KEYS[1] the product's lock  ARGV[1] the holder's token
-- Returns 1 released | 0 not this holder's (expired, or another holder's now).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
