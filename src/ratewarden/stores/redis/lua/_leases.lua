-- ratewarden: a concurrency limit's lease table (see ratewarden/stores/leases.py,
-- whose LeaseTable this mirrors exactly). One key per limit and caller's key: a
-- sorted set of lease ids scored by expiry, integer microseconds of Redis TIME;
-- beside it the waiters' tickets, in two sorted sets of one hash tag: by rank
-- (members ordered as strings, all scored 0) and by when each ends.
-- KEYS[1]: the leases, KEYS[2]: the tickets by rank, KEYS[3]: by end.
-- ARGV: op ("take", "renew", "release", "count", "leave"), lease id, limit, lease
-- length (us), now (us; "" reads the server's TIME), priority, queued_at (us; 0:
-- not queued yet), ticket length (us; 0: a take that does not wait).
-- Replies {status, held, reclaimed, wait_us, queued_at}; every op first drops the
-- leases that have ended (expiry <= now): a dead holder's slot comes back here.
local key, op, id = KEYS[1], ARGV[1], ARGV[2]
local ranks, ends = KEYS[2], KEYS[3]
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
-- a caller with no place in line sends no ARGV[6..8] (read as 0); with an op
-- other than take it sends the lease key alone: no ticket is its to find, and
-- ended ones wait for a take
local queued_at, ticket_us = tonumber(ARGV[7] or "0"), tonumber(ARGV[8] or "0")
local arrival = queued_at
if arrival == 0 then
  arrival = now
end
-- a ticket is its rank, ordered as bytes: higher priority first, then who asked
-- first, then the id
local ticket = nil
if queued_at > 0 or ticket_us > 0 then
  ticket = string.format("%08x%014x", 2147483647 - tonumber(ARGV[6]), arrival) .. id
end
local waiting = 0 -- take: the tickets before this caller's; leave: whether its own went
if #KEYS == 3 and redis.call("EXISTS", ends) == 1 then
  local ended = redis.call("ZRANGEBYSCORE", ends, "-inf", int(now), "LIMIT", 0, 1000)
  if #ended > 0 then
    redis.call("ZREM", ranks, unpack(ended))
    redis.call("ZREM", ends, unpack(ended))
  end
  if (op == "leave" or op == "release") and queued_at > 0 then
    waiting = redis.call("ZREM", ranks, ticket)
    redis.call("ZREM", ends, ticket)
  elseif op == "take" then
    if ticket_us > 0 then
      waiting = redis.call("ZLEXCOUNT", ranks, "-", "(" .. ticket)
    else
      waiting = redis.call("ZCARD", ranks)
    end
  end
end
if op == "leave" then
  return {waiting, redis.call("ZCOUNT", key, "(" .. int(now), "+inf"), 0, 0, 0}
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
  if held + waiting < tonumber(ARGV[3]) then
    if redis.call("ZADD", key, "NX", int(now + tonumber(ARGV[4])), id) == 0 then
      return {-1, held, reclaimed, 0, 0}
    end
    expire(held == 0)
    if ticket_us > 0 then -- granted: its ticket, if it had one, goes
      redis.call("ZREM", ranks, ticket)
      redis.call("ZREM", ends, ticket)
    end
    return {1, held + 1, reclaimed, 0, 0}
  end
  local wait = 0
  if held > 0 then
    wait = tonumber(redis.call("ZRANGE", key, 0, 0, "WITHSCORES")[2]) - now
  end
  if ticket_us <= 0 then
    return {0, held, reclaimed, wait, 0}
  end
  redis.call("ZADD", ranks, 0, ticket)
  redis.call("ZADD", ends, int(now + ticket_us), ticket)
  -- the sets outlive their last ticket by a millisecond: each ticket ends later
  -- than those before it (the tickets of a limit are all as long)
  local ms = int(math.floor(ticket_us / 1000) + 1)
  redis.call("PEXPIRE", ranks, ms)
  redis.call("PEXPIRE", ends, ms)
  return {0, held, reclaimed, wait, arrival}
end
if op == "count" then
  return {1, held, reclaimed, 0, 0}
end
if not own then
  return {0, held, reclaimed, 0, 0}
end
if tonumber(own) <= now then
  return {2, held, reclaimed, 0, 0}
end
if op == "renew" then
  redis.call("ZADD", key, "XX", int(now + tonumber(ARGV[4])), id)
  expire(false)
  return {1, held, reclaimed, 0, 0}
end
redis.call("ZREM", key, id)
return {1, held - 1, reclaimed, 0, 0}
