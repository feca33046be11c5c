-- ratewarden fleet quotas: the coordinator, one script call per operation.
-- Mirrors ratewarden/fleet/_model.py (the parity suite runs both with one clock)
-- and ratewarden/fleet/_alloc.py (the allocation functions).
--
-- KEYS[1]: the resource's configuration (hash); KEYS[2]: its members (hash:
-- member id -> seq, expires_ms, wants_m, has_m, used_m packed as five big-endian
-- doubles: one C call to read, where parsing text cost 40% of the script's
-- time). Both keys carry one hash tag.
-- Quantities are integer millipermits per window; times integer milliseconds of
-- the Redis server's clock unless ARGV passes one (tests, simulations).
-- ARGV[1] is the operation: refresh, leave, set, show. ARGV[2] the channel that a
-- change of the total is published on, ARGV[3] the time ("" for the server's).

local CFG, MEMBERS = KEYS[1], KEYS[2]
local op, channel = ARGV[1], ARGV[2]

local function fdiv(a, b)  -- floor(a / b) for integers, exact even where a / b rounds
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local now = tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + fdiv(tonumber(t[2]), 1000)
end

local function read_cfg()
  local flat = redis.call('HGETALL', CFG)
  local cfg = {}
  for i = 1, #flat, 2 do cfg[flat[i]] = flat[i + 1] end
  return cfg, #flat > 0
end

local function num(cfg, field) return tonumber(cfg[field]) or 0 end

-- the live members, sorted by join order; the dead ones are deleted
local function live_members()
  local flat = redis.call('HGETALL', MEMBERS)
  local members, dead = {}, {}
  for i = 1, #flat, 2 do
    local ok, seq, expires, wants, has, used = pcall(struct.unpack, '>ddddd', flat[i + 1])
    if ok and expires > now then
      members[#members + 1] = {id = flat[i], seq = seq, expires = expires,
        wants = wants, has = has, used = used}
    else
      dead[#dead + 1] = flat[i]
    end
  end
  if #dead > 0 then redis.call('HDEL', MEMBERS, unpack(dead)) end
  table.sort(members, function(a, b) return a.seq < b.seq end)
  return members
end

local function save(m)
  redis.call('HSET', MEMBERS, m.id, struct.pack('>ddddd',
    m.seq, m.expires, m.wants, m.has, m.used))
end

-- allocation (see _alloc.py)
local function allocate(algorithm, total, wants, cap)
  local n, out = #wants, {}
  if n == 0 then return out end
  if algorithm == 'equal' then
    local base = fdiv(total, n)
    local extra = total - base * n
    for i = 1, n do out[i] = base + ((i <= extra) and 1 or 0) end
    return out
  end
  if algorithm == 'static' then
    for i = 1, n do out[i] = math.min(wants[i], cap) end
    return out
  end
  local demand = 0
  for i = 1, n do demand = demand + wants[i] end
  if demand <= total then
    for i = 1, n do out[i] = wants[i] end
    return out
  end
  if algorithm == 'proportional_share' then
    local equal = total / n
    local left, excess = 0.0, 0.0
    for i = 1, n do
      if wants[i] <= equal then left = left + (equal - wants[i])
      else excess = excess + (wants[i] - equal) end
    end
    for i = 1, n do
      if wants[i] <= equal then out[i] = wants[i]
      else out[i] = math.floor(equal + left * (wants[i] - equal) / excess) end
    end
    return out
  end
  -- fair_share: water-filling
  local sorted = {}
  for i = 1, n do sorted[i] = wants[i] end
  table.sort(sorted)
  local remaining, count, level = total, n, 0
  for i = 1, n do
    level = fdiv(remaining, count)
    if sorted[i] > level then break end
    remaining = remaining - sorted[i]
    count = count - 1
  end
  for i = 1, n do out[i] = math.min(wants[i], level) end
  return out
end

local function cfg_list(cfg)
  local flat = {}
  for field, value in pairs(cfg) do
    flat[#flat + 1] = field
    flat[#flat + 1] = value
  end
  return flat
end

-- a lower effective total: every member's holding scaled down with it, so that
-- what the coordinator counts as held never exceeds the total; members hear it
-- on the channel and scale their own grant at once
local function cut(cfg, new_eff, members)
  local old = num(cfg, 'eff_m')
  redis.call('HSET', CFG, 'eff_m', new_eff)
  cfg.eff_m = tostring(new_eff)
  if new_eff < old then
    for _, m in ipairs(members) do
      m.has = fdiv(m.has * new_eff, old)
      save(m)
    end
  end
  redis.call('PUBLISH', channel, string.format('%s %d %d', cfg.version or '0', new_eff, old))
end

if op == 'show' then
  local cfg, found = read_cfg()
  if not found then return {0} end
  local out = {1, now, cfg_list(cfg)}
  for _, m in ipairs(live_members()) do
    out[#out + 1] = {m.id, m.seq, m.expires, m.wants, m.has, m.used}
  end
  return out
end

if op == 'set' then
  -- ARGV[4..]: field, value pairs; 'total' in permits resets the effective total
  local cfg, found = read_cfg()
  local members = live_members()
  local old_eff = num(cfg, 'eff_m')
  for i = 4, #ARGV, 2 do
    redis.call('HSET', CFG, ARGV[i], ARGV[i + 1])
    cfg[ARGV[i]] = ARGV[i + 1]
  end
  local version = redis.call('HINCRBY', CFG, 'version', 1)
  cfg.version = tostring(version)
  local eff = num(cfg, 'total') * 1000
  if found then
    cfg.eff_m = tostring(old_eff)
    cut(cfg, eff, members)
  else
    redis.call('HSET', CFG, 'eff_m', eff, 'seq', 0)
  end
  return {1, version, eff, old_eff}
end

local id = ARGV[4]

if op == 'leave' then
  redis.call('HDEL', MEMBERS, id)
  return {1}
end

-- refresh: ARGV[4] id, [5] wants_m, [6] has_m, [7] used_m, [8] throttled (the
-- provider refused while the member kept its share), [9..] the configuration the
-- member last knew, to restore if Redis lost it
local wants, reported, used, throttled = tonumber(ARGV[5]), tonumber(ARGV[6]),
  tonumber(ARGV[7]), tonumber(ARGV[8])
local cfg, found = read_cfg()
if not found then
  if #ARGV < 9 then return {0} end
  for i = 9, #ARGV, 2 do
    redis.call('HSET', CFG, ARGV[i], ARGV[i + 1])
    cfg[ARGV[i]] = ARGV[i + 1]
  end
  -- rebuilt from what a member knew: until every live member has reported once
  -- (a lease), nobody gets more than it says it holds
  cfg.rebuild_ms = tostring(now + num(cfg, 'lease_ms'))
  cfg.seq = '0'
  redis.call('HSET', CFG, 'rebuild_ms', cfg.rebuild_ms, 'seq', 0)
end

local members = live_members()
local me
for _, m in ipairs(members) do
  if m.id == id then me = m end
end
if not me then
  local seq = redis.call('HINCRBY', CFG, 'seq', 1)
  cfg.seq = tostring(seq)
  me = {id = id, seq = seq, has = 0}
  members[#members + 1] = me
  table.sort(members, function(a, b) return a.seq < b.seq end)
end
me.expires = now + num(cfg, 'lease_ms')
me.wants, me.used = wants, used

local refresh_ms = num(cfg, 'refresh_ms')
if cfg.adaptive == '1' then
  local ceiling = num(cfg, 'total') * 1000
  local eff = num(cfg, 'eff_m')
  local calm = now - num(cfg, 'cut_ms') >= 2 * refresh_ms
  if throttled > 0 and calm then
    redis.call('HSET', CFG, 'cut_ms', now, 'raise_ms', now)
    cfg.cut_ms, cfg.raise_ms = tostring(now), tostring(now)
    cut(cfg, math.max(num(cfg, 'floor_m'), fdiv(eff * 3, 4)), members)
  elseif throttled == 0 and calm and eff < ceiling and now - num(cfg, 'raise_ms') >= refresh_ms then
    local raised = math.min(ceiling, eff + math.max(1000, fdiv(ceiling, 50)))
    redis.call('HSET', CFG, 'eff_m', raised, 'raise_ms', now)
    cfg.eff_m, cfg.raise_ms = tostring(raised), tostring(now)
  end
end

local total = num(cfg, 'eff_m')
local all_wants, others, mine = {}, 0, 0
for i, m in ipairs(members) do
  all_wants[i] = m.wants
  if m == me then mine = i else others = others + m.has end
end
local target = allocate(cfg.algorithm, total, all_wants, num(cfg, 'cap_m'))[mine]
local grant = math.max(0, math.min(target, total - others))
if now < num(cfg, 'rebuild_ms') then grant = math.min(grant, reported) end
me.has = grant
save(me)

local held, before = 0, 0
for i, m in ipairs(members) do
  held = held + m.has
  if i < mine then before = before + m.has end
end
return {1, grant, held, before, #members, now, cfg_list(cfg)}
