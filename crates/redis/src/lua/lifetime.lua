-- Prelude of every script (calls.rs prepends it, after stamp.lua): whether `ms` (a
-- number or nil) is a lifetime a script may give a key. Whole milliseconds from 1 to
-- LIFETIME_MS_MAX (about 317 years), so that it and `now + ms` stay below 10^14, which
-- Lua and Redis write as digits: a larger one would reach PEXPIRE or SET PX in exponent
-- form and be refused after the script's first writes.
local LIFETIME_MS_MAX = 10000000000000
local function lifetime_ok(ms)
  return ms ~= nil and ms >= 1 and ms % 1 == 0 and ms <= LIFETIME_MS_MAX
end
