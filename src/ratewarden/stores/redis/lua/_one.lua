-- ratewarden: one limit, one key.
-- KEYS[1]  the key
-- ARGV     now_us ("" = Redis server TIME), cost, the limit's packed constants,
--          mode ("hit" | "peek")
-- returns  {allowed (0|1), remaining, reset_after, retry_after (-1 = never)} in ticks
local key = KEYS[1]
local now_us, explicit = clock(ARGV[1])
local cost = tonumber(ARGV[2])
tick, limit, period, burst, scale, unit, capacity, span = struct.unpack('>dddddddd', ARGV[3])
local now = now_us
if tick > 1 then now = fdiv(now_us, tick) end

local state = load(key)
local allowed, remaining, reset, retry, new = step(state, now, cost)
if ARGV[4] == 'peek' then
  if allowed == 1 then  -- report the state as it stands, as algorithms.peek does
    local _, now_remaining, now_reset = step(state, now, math.max(limit, burst) + 1)
    remaining, reset = now_remaining, now_reset
  end
elseif new ~= state then
  save(key, new, now, tick, explicit)
end
return {allowed, remaining, reset, retry}
