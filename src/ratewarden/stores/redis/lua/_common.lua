-- ratewarden: shared head of every script. The Python package joins it to the
-- algorithms' step functions and to a body: _one.lua (one limit, one key) or
-- _many.lua (every tier of one request). Mirrors ratewarden/algorithms/*.py exactly.
--
-- Time is integer ticks of tick_us microseconds (1 unless the limit's numbers would
-- not fit). Lua numbers are doubles, exact for integers below 2^53; every quantity
-- here stays integral, and fdiv is an exact floor division.
-- A limit's constants arrive packed as 8 big-endian doubles (tick_us, limit, period,
-- burst, scale, unit, capacity, span): packed once per limit, unpacked by one C call.
-- State is stored as packed big-endian doubles too: exact, and far cheaper to read
-- and write than text.

-- The limit being stepped: the step functions read these as upvalues.
local tick, limit, period, burst, scale, unit, capacity, span
local STEPS = {}  -- _many.lua: the step functions by number (see scripts.py, STEP_IDS)
local BUCKETS = 4  -- step numbers from here on size their limit by burst
-- library functions as locals: a global and a field lookup less on every use
local floor, sunpack, spack = math.floor, struct.unpack, struct.pack

-- floor(a / b) for integers, b > 0, exact even where a / b rounds
local function fdiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- now_us: ARGV's explicit time (tests), else the server's clock
local function clock(arg)
  local explicit = tonumber(arg)
  if explicit then return explicit, true end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2]), false
end

-- struct formats of n doubles, built once per length
local FORMATS = setmetatable({'>d', '>dd', '>ddd'}, {__index = function(formats, n)
  local format = '>' .. string.rep('d', n)
  formats[n] = format
  return format
end})

-- A state from its stored value (false: none).
local function decode(raw)
  if not raw then return nil end
  local n = #raw / 8
  if n <= 100 then
    local state = {sunpack(FORMATS[n], raw)}
    state[n + 1] = nil  -- unpack's last value is the next position
    return state
  end
  local state, at = {}, 1
  while at <= #raw do
    state[#state + 1], at = struct.unpack('>d', raw, at)
  end
  return state
end

local function load(key)
  return decode(redis.call('GET', key))
end

local function encode(state)
  local n = #state
  if n <= 100 then return spack(FORMATS[n], unpack(state)) end
  -- packed 100 at a time: unpack() of a long log would overflow Lua's C stack
  local parts = {}
  for first = 1, n, 100 do
    local last = math.min(first + 99, n)
    parts[#parts + 1] = struct.pack(FORMATS[last - first + 1], unpack(state, first, last))
  end
  return table.concat(parts)
end

-- PX for a state full again at full_at (element 1 of every state: past it, a state
-- means nothing), or nil if it already is.
local function ttl_px(full_at, now, tick_us, explicit)
  local ttl_us = (full_at - now) * tick_us
  if ttl_us <= 0 then return nil end
  -- With an explicit (test) clock, real time and script time drift apart: keep a
  -- minute's margin so a key never expires before its state is full (a busy machine
  -- stalled a test past a one-second margin between a peek and its hit).
  local margin = explicit and 60000 or 1
  -- a string, not a number: Redis formats number arguments slowly
  return string.format('%d', math.ceil(ttl_us / 1000) + margin)
end

-- Store a state until it is full again, or drop it if it already is.
local function save(key, state, now, tick_us, explicit)
  local px = ttl_px(state[1], now, tick_us, explicit)
  if px then
    redis.call('SET', key, encode(state), 'PX', px)
  else
    redis.call('DEL', key)
  end
end
