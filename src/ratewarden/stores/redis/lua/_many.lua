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
local now_us, explicit = clock(ARGV[1])
local mode, tiers = ARGV[2], ARGV[3]
local enforced = tonumber(ARGV[4]) or #KEYS
local states = {}   -- key -> its state as the tiers so far left it (false: none)
local raws = redis.call('MGET', unpack(KEYS))  -- one call for every tier's state

-- Step tiers first..last; returns whether all passed, the tier that speaks for
-- them and its answer, and the keys to write {key, state, now, tick} in order.
local function phase(first, last)
  local written, finals = {}, {}
  local best, best_size, best_tick = {0, 1, 0, 0, 0}, 0, 0
  local all_pass = true
  for i = first, last do
    local key = KEYS[i]
    local step_id, cost
    step_id, cost, tick, limit, period, burst, scale, unit, capacity, span =
      struct.unpack('>dddddddddd', tiers, 80 * i - 79)
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
      if not finals[key] then written[#written + 1] = key end
      finals[key] = {new, now, tick}
      -- the tightest tier: least remaining relative to its size
      if all_pass and (best[1] == 0 or remaining * best_size < best[3] * size) then
        best, best_size, best_tick = {i, 1, remaining, reset, retry}, size, tick
      end
    else
      -- the longest wait (-1: never), in microseconds across ticks
      if all_pass or (best[5] >= 0 and (retry < 0 or retry * tick > best[5] * best_tick)) then
        best, best_size, best_tick = {i, 0, remaining, reset, retry}, size, tick
      end
      all_pass = false
    end
  end
  return all_pass, best, written, finals
end

local out = {}
local function write(written, finals)
  for _, key in ipairs(written) do
    local final = finals[key]
    if mode == 'keep' then
      local n = #out
      out[n + 1], out[n + 2] = key, redis.call('GET', key) or ''
      save(key, final[1], final[2], final[3], explicit)
      out[n + 3] = redis.call('GET', key) or ''
    else
      save(key, final[1], final[2], final[3], explicit)
    end
  end
end

local passed, best, written, finals = phase(1, enforced)
local shadow_best = {0, 1, 0, 0, 0}
local triples = {}
if passed and mode ~= 'dry' then
  write(written, finals)
end
if passed and enforced < #KEYS then
  local shadow_passed, shadow_written, shadow_finals
  shadow_passed, shadow_best, shadow_written, shadow_finals = phase(enforced + 1, #KEYS)
  if shadow_passed and mode ~= 'dry' then write(shadow_written, shadow_finals) end
end
triples, out = out, {}
for _, part in ipairs({best, shadow_best, triples}) do
  for _, value in ipairs(part) do out[#out + 1] = value end
end
return out
