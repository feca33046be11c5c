-- ratewarden: the two-tier store's sync. Adds what processes admitted on their own
-- (deltas, counted whatever the limit says: those requests have passed), then tries
-- the exact checks asked for, and returns every key's state for the local estimates.
-- KEYS     one key per entry (distinct), then the call's id key, in the same hash slot
-- ARGV[1]  now_us ("" = Redis server TIME)
-- ARGV[2]  per key 14 big-endian doubles: step number, delta (may be negative: a
--          refund), the tick of the end of the window the delta was admitted in (0 for
--          buckets), the previous window's delta (sliding window counter), the cost
--          of an exact check (0: none), a lease: units to count beyond that cost if
--          they fit, for the process to hand out itself (0: none), then the limit's 8
--          constants
-- ARGV[3]  "all": the exact checks pass together or none counts (one request's tiers)
-- ARGV[4]  the id key's time to live, ms. A call whose id key exists already is a
--          resend of one applied (its reply was lost): it counts nothing and checks
--          nothing, and answers with the states as they are, so that a sync sent
--          again after a timeout is counted once
-- returns  {now_us, then per key: allowed (-1: no check), remaining, reset_after,
--          retry_after (-1 = never), the state as stored ("" = none), the lease
--          counted (0 when it did not fit: then only the cost was tried)}
local now_us, explicit = clock(ARGV[1])
local entries = ARGV[2]
local together = ARGV[3] == 'all'
local n = #KEYS - 1
local fresh = redis.call('SET', KEYS[n + 1], '1', 'NX', 'PX', ARGV[4])

-- Each algorithm's forced add: the state with delta counted in window dwin (and, for
-- the sliding window counter, pdelta in the window before), at now. A delta for a
-- window already over is dropped; one for a window the server has not reached yet
-- (the process's clock a little ahead) counts in the current one.
local FORCE = {}

FORCE[1] = function(state, now, delta, dwin)  -- fixed window: {window_end, used}
  local window_end, used
  if state and now < state[1] then
    window_end, used = state[1], state[2]
  else
    window_end, used = fdiv(now, period) * period + period, 0
  end
  if dwin >= window_end then used = math.max(used + delta, 0) end
  if used == 0 then return state end
  return {window_end, used}
end

FORCE[2] = function(state, now, delta, dwin, pdelta)  -- sliding window counter
  local window_end, prev, curr = swc_roll(state, now)
  if dwin >= window_end then
    curr = math.max(curr + delta, 0)
    if pdelta ~= 0 then prev = math.max(prev + pdelta, 0) end
  elseif dwin == window_end - period then
    prev = math.max(prev + delta, 0)
  end
  if curr > 0 then return {window_end + period, prev, curr} end
  if prev > 0 then return {window_end, prev, 0} end
  return nil
end

FORCE[4] = function(state, now, delta)  -- continuous bucket: {full_at, rem}
  local debt = 0
  if state and state[1] > now then debt = (state[1] - now) * scale - state[2] end
  debt = math.max(debt + delta * unit, 0)
  if debt == 0 then return nil end
  local wait = -fdiv(-debt, scale)
  return {now + wait, wait * scale - debt}
end

local nows, olds, counted, states, limits, leases = {}, {}, {}, {}, {}, {}
local out = {now_us}
local passed = true
for i = 1, n do
  local step_id, delta, dwin, pdelta, cost, lease
  step_id, delta, dwin, pdelta, cost, lease, tick, limit, period, burst, scale, unit, capacity,
    span = struct.unpack('>dddddddddddddd', entries, 112 * i - 111)
  if not fresh then delta, pdelta, cost = 0, 0, 0 end  -- applied already: as it is
  local now = now_us
  if tick > 1 then now = fdiv(now_us, tick) end
  local old = load(KEYS[i])
  local state = old
  if delta ~= 0 or pdelta ~= 0 then state = FORCE[step_id](state, now, delta, dwin, pdelta) end
  local allowed, remaining, reset, retry = -1, 0, 0, 0
  leases[i] = 0
  if cost > 0 then
    local new
    if lease > 0 then
      allowed, remaining, reset, retry, new = STEPS[step_id](state, now, cost + lease)
      if allowed == 1 then leases[i] = lease end
    end
    if leases[i] == 0 then
      allowed, remaining, reset, retry, new = STEPS[step_id](state, now, cost)
    end
    if allowed == 1 then
      olds[i], counted[i] = state, true  -- kept, should the request's other tiers fail
      state = new
    else
      passed = false
    end
  end
  nows[i], states[i] = now, state
  limits[i] = {tick, limit, period, burst, scale, unit, capacity, span, old}
  local at = 6 * i - 4  -- out[1] is now_us; six values a key
  out[at], out[at + 1], out[at + 2], out[at + 3] = allowed, remaining, reset, retry
end
for i = 1, n do
  local state = states[i]
  if together and not passed and counted[i] then
    state = olds[i]
    out[6 * i - 4] = 0  -- another tier denied: this one counts nothing either
    leases[i] = 0
  end
  if state and state[1] <= nows[i] then state = nil end  -- full again: no state to keep
  local l = limits[i]
  tick, limit, period, burst, scale, unit, capacity, span = l[1], l[2], l[3], l[4], l[5],
    l[6], l[7], l[8]
  if state ~= l[9] then
    if state then save(KEYS[i], state, nows[i], tick, explicit) else redis.call('DEL', KEYS[i]) end
  end
  out[6 * i] = state and encode(state) or ''
  out[6 * i + 1] = leases[i]
end
return out
