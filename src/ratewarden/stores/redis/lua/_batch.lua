-- ratewarden: many independent checks in one call (AsyncRedisStore on one node
-- sends every check that arrived in one turn of its event loop this way).
-- KEYS     one key per check (a key may repeat: its checks then run in order)
-- ARGV[1]  per check 12 big-endian doubles: step number, peek (0|1), cost, now_us
--          (-1 = Redis server TIME, read once for the whole call), then the limit's
--          8 constants
-- returns  per check {allowed, remaining, reset_after, retry_after}, flattened: each
--          exactly what _one.lua would answer, run one after another
local checks = ARGV[1]
local server_now = nil
local states = {}  -- key -> its state as the checks so far left it (false: none)
local out = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local step_id, peek, cost, now_us
  step_id, peek, cost, now_us, tick, limit, period, burst, scale, unit, capacity, span =
    struct.unpack('>dddddddddddd', checks, 96 * i - 95)
  local explicit = now_us >= 0
  if not explicit then
    if not server_now then server_now = clock('') end
    now_us = server_now
  end
  local now = now_us
  if tick > 1 then now = fdiv(now_us, tick) end
  local state = states[key]
  if state == nil then state = load(key) or false end
  local step = STEPS[step_id]
  local allowed, remaining, reset, retry, new = step(state or nil, now, cost)
  if peek == 1 then
    if allowed == 1 then  -- report the state as it stands, as algorithms.peek does
      local _, now_remaining, now_reset = step(state or nil, now, math.max(limit, burst) + 1)
      remaining, reset = now_remaining, now_reset
    end
    states[key] = state
  else
    if new ~= state then save(key, new, now, tick, explicit) end
    states[key] = new
  end
  local n = #out
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = allowed, remaining, reset, retry
end
return out
