-- ratewarden: one reservation of one key, after _settle.lua; ALGORITHM names the
-- step joined before it (see scripts.py).
-- KEYS[1]  the key
-- ARGV     now_us ("" = Redis server TIME), mode ("reserve" | "settle"),
--          cost (reserve) or delta = actual - estimate (settle),
--          the limit's packed constants, the reservation's mark and estimate (settle)
-- returns  reserve: {allowed (0|1), remaining, reset_after, retry_after (-1 = never),
--          mark} in ticks; settle: 1
local key = KEYS[1]
local now_us, explicit = clock(ARGV[1])
local amount = tonumber(ARGV[3])
tick, limit, period, burst, scale, unit, capacity, span = struct.unpack('>dddddddd', ARGV[4])
local now = now_us
if tick > 1 then now = fdiv(now_us, tick) end

local state = load(key)
if ARGV[2] == 'reserve' then
  local allowed, remaining, reset, retry, new = step(state, now, amount)
  if new ~= state then save(key, new, now, tick, explicit) end
  local mark = 0
  if allowed == 1 then mark = MARK[ALGORITHM](new, now) end
  return {allowed, remaining, reset, retry, mark}
end
local new = SETTLE[ALGORITHM](state, now, amount, tonumber(ARGV[5]), tonumber(ARGV[6]))
if new and new ~= state then save(key, new, now, tick, explicit) end
return 1
