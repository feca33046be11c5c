-- ratewarden: shared head of every algorithm script (the Python package joins it to
-- the algorithm's step and the epilogue). Mirrors ratewarden/algorithms/*.py exactly.
--
-- KEYS[1]  the key
-- ARGV     now_us ("" = Redis server TIME), cost, limit, period_us, burst, scale, unit,
--          capacity, span, mode ("hit" | "peek")
-- returns  {allowed (0|1), remaining, reset_after_us, retry_after_us (-1 = never)}
--
-- Time is integer microseconds. Lua numbers are doubles, exact for integers below
-- 2^53; every quantity here stays integral, and fdiv is an exact floor division.
local key = KEYS[1]
local explicit_now = tonumber(ARGV[1])
local now = explicit_now
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[2])
local limit, period, burst = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local scale, unit = tonumber(ARGV[6]), tonumber(ARGV[7])
local capacity, span = tonumber(ARGV[8]), tonumber(ARGV[9])
local mode = ARGV[10]

-- floor(a / b) for integers, b > 0, exact even where a / b rounds
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end
