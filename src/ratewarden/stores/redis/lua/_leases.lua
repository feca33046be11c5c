-- ratewarden: a concurrency limit's lease table (see ratewarden/stores/leases.py,
-- whose LeaseTable this mirrors exactly). One key per limit and caller's key: a
-- sorted set of lease ids scored by expiry, integer microseconds of Redis TIME.
-- KEYS[1]: the set. ARGV: op ("take", "renew", "release", "count"), lease id,
-- limit, lease length (us), now (us; "" reads the server's TIME).
-- Replies {status, held, reclaimed, wait_us}; every op first drops the leases
-- that have ended (expiry <= now): a dead holder's slot comes back here.
local key, op, id = KEYS[1], ARGV[1], ARGV[2]
local now
if ARGV[5] == "" then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[5])
end
-- numbers go to Redis as text written here: Lua's own rendering of a double
-- keeps 14 digits, and a time in microseconds has 16
local function int(x)
  return string.format("%d", x)
end
local own = nil
if op == "renew" or op == "release" then
  own = redis.call("ZSCORE", key, id)
end
local reclaimed = redis.call("ZREMRANGEBYSCORE", key, "-inf", int(now))
local held = redis.call("ZCARD", key)
-- the set outlives its last lease by a millisecond, no longer (counted from
-- this call's now, so that a test's clock keeps its keys as the server's would):
-- GT never shortens the life a longer lease of another limiter of the name gave
-- it; a set that was empty has no expiry yet, which GT would keep
local function expire(was_empty)
  local ms = int(math.floor(tonumber(ARGV[4]) / 1000) + 1)
  if was_empty then
    redis.call("PEXPIRE", key, ms)
  else
    redis.call("PEXPIRE", key, ms, "GT")
  end
end
if op == "take" then
  if held < tonumber(ARGV[3]) then
    if redis.call("ZADD", key, "NX", int(now + tonumber(ARGV[4])), id) == 0 then
      return {-1, held, reclaimed, 0}
    end
    expire(held == 0)
    return {1, held + 1, reclaimed, 0}
  end
  local first = redis.call("ZRANGE", key, 0, 0, "WITHSCORES")
  return {0, held, reclaimed, tonumber(first[2]) - now}
end
if op == "count" then
  return {1, held, reclaimed, 0}
end
if not own then
  return {0, held, reclaimed, 0}
end
if tonumber(own) <= now then
  return {2, held, reclaimed, 0}
end
if op == "renew" then
  redis.call("ZADD", key, "XX", int(now + tonumber(ARGV[4])), id)
  expire(false)
  return {1, held, reclaimed, 0}
end
redis.call("ZREM", key, id)
return {1, held - 1, reclaimed, 0}
