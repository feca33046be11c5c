-- ratewarden: every tier of one request, all or nothing.
-- KEYS     one key per tier (a key may repeat: its tiers then step one after another)
-- ARGV     now_us ("" = Redis server TIME), mode, then per tier: step number, cost,
--          the limit's packed constants
-- mode     "hit": count in every tier if every tier passes, else count nowhere;
--          "dry": count nowhere; "keep": as "hit", and also return, for each key
--          written, the key, its value before and its value after (for a refund
--          when tiers in other cluster slots deny; see _refund.lua)
-- returns  per tier {allowed, remaining, reset_after, retry_after} in that tier's
--          ticks, flattened; then, with "keep" and all passed, the key triples
local now_us, explicit = clock(ARGV[1])
local mode = ARGV[2]
local states = {}   -- key -> its state as the tiers so far left it (false: none)
local written = {}  -- keys in first-write order
local finals = {}   -- key -> {state, now, tick} of its last passing tier
local out = {}
local all_pass = true
for i = 1, #KEYS do
  local key, at = KEYS[i], 3 * i
  local step = STEPS[tonumber(ARGV[at])]
  local cost = tonumber(ARGV[at + 1])
  tick, limit, period, burst, scale, unit, capacity, span =
    struct.unpack('>dddddddd', ARGV[at + 2])
  local now = now_us
  if tick > 1 then now = fdiv(now_us, tick) end
  local state = states[key]
  if state == nil then
    state = load(key) or false
    states[key] = state
  end
  local allowed, remaining, reset, retry, new = step(state or nil, now, cost)
  local n = #out
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = allowed, remaining, reset, retry
  if allowed == 1 then
    states[key] = new
    if not finals[key] then written[#written + 1] = key end
    finals[key] = {new, now, tick}
  else
    all_pass = false
  end
end
if all_pass and mode ~= 'dry' then
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
return out
