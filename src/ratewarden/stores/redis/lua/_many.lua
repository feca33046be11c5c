-- ratewarden: every tier of one request, all or nothing.
-- KEYS     one key per tier (a key may repeat: its tiers then step one after another)
-- ARGV     now_us ("" = Redis server TIME), mode, then every tier's step number, cost
--          and the limit's 8 constants, as 10 big-endian doubles a tier in one string;
--          then how many of the tiers are enforced ("" = all), the rest being shadow
--          tiers: checked only if the enforced ones all passed, all or nothing among
--          themselves, and never denying the request
-- mode     "hit": count in every tier if every tier passes, else count nowhere;
--          "dry": count nowhere; "keep": as "hit", and also return, for each key
--          written, the key, its value before and its value after (for a refund
--          when tiers in other cluster slots deny; see _refund.lua)
-- returns  {tier, allowed, remaining, reset_after, retry_after}: the tier that speaks
--          for the request (as ratewarden.stores.base.pick chooses) and its answer
--          in its ticks (tier 0: there were no enforced tiers); the same for the shadow
--          tiers (tier 0: none were checked); then, with "keep" when all passed, the
--          key triples
-- The tiers' answers are kept in scalars and parallel arrays rather than a table
-- each: Lua in Redis pays for every table and every C call, and a request's tiers
-- are checked on every request.
local now_us, explicit = clock(ARGV[1])
local mode, tiers = ARGV[2], ARGV[3]
local n = #KEYS
local enforced = tonumber(ARGV[4]) or n
local states = {}   -- key -> its state as the tiers so far left it (false: none)
local last = {}     -- key -> the last tier that counted on it (its now and tick save it)
local nows, ticks = {}, {}  -- per tier that counted
local raws = redis.call('MGET', unpack(KEYS))  -- one call for every tier's state
local out = {0, 1, 0, 0, 0, 0, 1, 0, 0, 0}

-- Step tiers first..last_tier, its answer in out[at + 1 .. at + 5]; returns whether
-- all passed and the keys they would write, in order.
local function phase(first, last_tier, at)
  local written = {}
  local best, best_size, best_tick = 0, 0, 0
  local all_pass = true
  for i = first, last_tier do
    local key = KEYS[i]
    local step_id, cost
    step_id, cost, tick, limit, period, burst, scale, unit, capacity, span =
      sunpack('>dddddddddd', tiers, 80 * i - 79)
    local now = now_us
    if tick > 1 then now = fdiv(now_us, tick) end
    local state = states[key]
    if state == nil then
      state = decode(raws[i]) or false
      states[key] = state
    end
    local allowed, remaining, reset, retry, new = STEPS[step_id](state or nil, now, cost)
    local size = limit
    if step_id >= BUCKETS then size = burst end
    if allowed == 1 then
      states[key] = new
      if not last[key] or last[key] < first then written[#written + 1] = key end
      last[key], nows[i], ticks[i] = i, now, tick
      -- the tightest tier: least remaining relative to its size
      if all_pass and (best == 0 or remaining * best_size < out[at + 3] * size) then
        best, best_size, best_tick = i, size, tick
        out[at + 1], out[at + 2], out[at + 3], out[at + 4], out[at + 5] =
          i, 1, remaining, reset, retry
      end
    else
      -- the longest wait (-1: never), in microseconds across ticks
      local best_retry = out[at + 5]
      if all_pass or (best_retry >= 0 and (retry < 0 or retry * tick > best_retry * best_tick)) then
        best, best_size, best_tick = i, size, tick
        out[at + 1], out[at + 2], out[at + 3], out[at + 4], out[at + 5] =
          i, 0, remaining, reset, retry
      end
      all_pass = false
    end
  end
  return all_pass, written
end

local function write(written)
  for j = 1, #written do
    local key = written[j]
    local i = last[key]
    if mode == 'keep' then
      local k = #out
      out[k + 1], out[k + 2] = key, redis.call('GET', key) or ''
      save(key, states[key], nows[i], ticks[i], explicit)
      out[k + 3] = redis.call('GET', key) or ''
    else
      save(key, states[key], nows[i], ticks[i], explicit)
    end
  end
end

local passed, written = phase(1, enforced, 0)
if passed and mode ~= 'dry' then write(written) end
if passed and enforced < n then
  local shadow_passed, shadow_written = phase(enforced + 1, n, 5)
  if shadow_passed and mode ~= 'dry' then write(shadow_written) end
end
return out
