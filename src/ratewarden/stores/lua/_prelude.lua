-- ratewarden: shared head of every algorithm script (the Python package joins it to
-- the algorithm's step and the epilogue). Mirrors ratewarden/algorithms/*.py exactly.
--
-- KEYS[1]  the key
-- ARGV     now_us ("" = Redis server TIME), cost, the limit's constants packed as 8
--          big-endian doubles (tick_us, limit, period, burst, scale, unit, capacity,
--          span: packed once per limit, unpacked by one C call), mode ("hit" | "peek")
-- returns  {allowed (0|1), remaining, reset_after, retry_after (-1 = never)} in ticks
--
-- Time is integer ticks of tick_us microseconds (1 unless the limit's numbers would
-- not fit). Lua numbers are doubles, exact for integers below 2^53; every quantity
-- here stays integral, and fdiv is an exact floor division.
-- State is stored as packed big-endian doubles: exact, and far cheaper to read and
-- write than text.
local key = KEYS[1]
local explicit_now = tonumber(ARGV[1])
local now = explicit_now
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[2])
local tick, limit, period, burst, scale, unit, capacity, span =
  struct.unpack('>dddddddd', ARGV[3])
local mode = ARGV[4]

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

if tick > 1 then now = fdiv(now, tick) end
