-- ratewarden fleet quotas: the coordinator, one script call per operation.
-- Mirrors ratewarden/fleet/model.py (the parity suite runs both with one clock)
-- and ratewarden/fleet/alloc.py (the allocation functions).
--
-- KEYS[1]: the resource's configuration (hash); KEYS[2]: its members (hash:
-- member id -> seq, expires_ms, wants_m, has_m, used_m, safe_m (what it falls
-- back to without Redis) and its number of pieces, then each piece's start and
-- length, packed as big-endian doubles: one C call
-- to read, where parsing text cost 40% of the script's time). Both keys carry
-- one hash tag. A member's grant lies in its pieces of the line [0, total); no
-- two live members' pieces overlap (see alloc.place).
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

-- space of the line given up now (a member shrank, moved, left or died; the
-- total was cut): a member may spend new space at once only when nothing was
-- given up for two windows, for until then its last holder may still spend it
-- (freed_ms). hard_ms is the last time space was given up other than by a
-- paced member at its refresh: members of an older version took such "soft"
-- space at once when they joined, and read it during a rolling upgrade; this
-- version's members wait for the window edge whoever gave it up (see member.py)
local function freed(cfg, paced)
  redis.call('HSET', CFG, 'freed_ms', now)
  cfg.freed_ms = tostring(now)
  if not paced then
    redis.call('HSET', CFG, 'hard_ms', now)
    cfg.hard_ms = tostring(now)
  end
end

-- how long a rebuild lasts: every member that still spends tries a refresh
-- every interval (10% jitter), so two intervals see them all; at most a lease
local function rebuild_span(cfg)
  return math.min(num(cfg, 'lease_ms'), 2 * num(cfg, 'refresh_ms'))
end

-- until now + rebuild_span, nobody is granted more than it says it holds,
-- nor a larger safe share than it had: members spend space this script does
-- not know of (Redis lost the resource, or their records ended while Redis was
-- away from them), and every one of them reports within the span
local function rebuild(cfg)
  cfg.rebuild_ms = tostring(math.max(num(cfg, 'rebuild_ms'), now + rebuild_span(cfg)))
  redis.call('HSET', CFG, 'rebuild_ms', cfg.rebuild_ms)
  freed(cfg)
end

local RECORD = '>ddddddd'  -- seq, expires, wants, has, used, safe, pieces

-- the live members, sorted by join order; the dead ones are deleted. A record
-- that ended while its member held a share (or that cannot be read) starts a
-- rebuild: the member may still be spending, on its grant or its safe share
local function live_members(cfg)
  local flat = redis.call('HGETALL', MEMBERS)
  local members, dead, lapsed = {}, {}, false
  for i = 1, #flat, 2 do
    local record = flat[i + 1]
    local ok, seq, expires, wants, has, used, safe, n, rest =
      pcall(struct.unpack, RECORD, record)
    ok = ok and #record == 56 + 16 * n
    local pieces = {}
    if ok and n > 0 then
      local got = {pcall(struct.unpack, '>' .. string.rep('d', 2 * n), record, rest)}
      ok = got[1]
      for k = 1, n do pieces[k] = {got[2 * k], got[2 * k + 1]} end
    end
    if ok and expires > now then
      members[#members + 1] = {id = flat[i], seq = seq, expires = expires,
        wants = wants, has = has, used = used, safe = safe, pieces = pieces}
    else
      dead[#dead + 1] = flat[i]
      if not ok or has > 0 or safe > 0 then lapsed = true end
    end
  end
  if #dead > 0 then redis.call('HDEL', MEMBERS, unpack(dead)) end
  if lapsed then rebuild(cfg) end
  table.sort(members, function(a, b) return a.seq < b.seq end)
  return members
end

local function save(m)
  local flat = {}
  for _, p in ipairs(m.pieces) do
    flat[#flat + 1] = p[1]
    flat[#flat + 1] = p[2]
  end
  redis.call('HSET', MEMBERS, m.id, struct.pack(RECORD .. string.rep('d', #flat),
    m.seq, m.expires, m.wants, m.has, m.used, m.safe, #m.pieces, unpack(flat)))
end

-- allocation (see alloc.py)
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

-- where a member's grant lies (see alloc.place): a smaller grant keeps the
-- start of what it had; a larger one keeps all it had and grows into the free
-- space next to its pieces, then into the largest free gaps, a piece each, up
-- to MAX_PIECES
local MAX_PIECES = 128

local function merge(pieces)
  table.sort(pieces, function(a, b) return a[1] < b[1] end)
  local out = {}
  for _, p in ipairs(pieces) do
    if #out > 0 and out[#out][2] == p[1] then out[#out][2] = p[2]
    else out[#out + 1] = {p[1], p[2]} end
  end
  return out
end

local function place(total, mine, want, taken)
  local has, pieces = 0, {}
  for _, p in ipairs(mine) do
    has = has + p[2]
    pieces[#pieces + 1] = {p[1], p[1] + p[2]}
  end
  table.sort(pieces, function(a, b) return a[1] < b[1] end)
  if want <= has then
    local kept, left = {}, want
    for _, p in ipairs(pieces) do
      if left <= 0 then break end
      local take = math.min(left, p[2] - p[1])
      kept[#kept + 1] = {p[1], take}
      left = left - take
    end
    return kept
  end
  local need = want - has
  -- the taken space's starts sorted as plain numbers (C's comparison, not a Lua
  -- function's: a fragmented line has a thousand pieces), each with its end
  local starts_of, end_of = {}, {}
  local function take_span(first, last)
    if end_of[first] == nil then starts_of[#starts_of + 1] = first end
    end_of[first] = math.max(end_of[first] or 0, last)
  end
  for _, p in ipairs(taken) do take_span(p[1], p[1] + p[2]) end
  for _, p in ipairs(pieces) do take_span(p[1], p[2]) end
  table.sort(starts_of)
  local gaps, at = {}, 0
  for _, first in ipairs(starts_of) do
    if first > at then gaps[#gaps + 1] = {at, first} end
    if end_of[first] > at then at = end_of[first] end
  end
  if at < total then gaps[#gaps + 1] = {at, total} end
  local ends, starts = {}, {}
  for _, p in ipairs(pieces) do
    ends[p[2]] = true
    starts[p[1]] = true
  end
  for _, g in ipairs(gaps) do  -- next to its own pieces first
    if need == 0 then break end
    if ends[g[1]] then
      local take = math.min(need, g[2] - g[1])
      pieces[#pieces + 1] = {g[1], g[1] + take}
      g[1] = g[1] + take
      need = need - take
    end
    if need > 0 and g[2] > g[1] and starts[g[2]] then
      local take = math.min(need, g[2] - g[1])
      pieces[#pieces + 1] = {g[2] - take, g[2]}
      g[2] = g[2] - take
      need = need - take
    end
  end
  pieces = merge(pieces)
  table.sort(gaps, function(a, b)  -- the largest first
    local sa, sb = a[2] - a[1], b[2] - b[1]
    if sa ~= sb then return sa > sb end
    return a[1] < b[1]
  end)
  for _, g in ipairs(gaps) do
    if need == 0 or g[2] <= g[1] or #pieces >= MAX_PIECES then break end
    local take = math.min(need, g[2] - g[1])
    pieces[#pieces + 1] = {g[1], g[1] + take}
    pieces = merge(pieces)
    need = need - take
  end
  local out = {}
  for _, p in ipairs(pieces) do out[#out + 1] = {p[1], p[2] - p[1]} end
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
    freed(cfg)
    for _, m in ipairs(members) do
      local pieces, has = {}, 0
      for _, p in ipairs(m.pieces) do
        local length = fdiv(p[2] * new_eff, old)
        if length > 0 then
          pieces[#pieces + 1] = {fdiv(p[1] * new_eff, old), length}
          has = has + length
        end
      end
      m.pieces, m.has, m.safe = pieces, has, fdiv(m.safe * new_eff, old)
      save(m)
    end
  end
  redis.call('PUBLISH', channel, string.format('%s %d %d', cfg.version or '0', new_eff, old))
end

if op == 'show' then
  local cfg, found = read_cfg()
  if not found then return {0} end
  local out = {1, now, cfg_list(cfg)}
  for _, m in ipairs(live_members(cfg)) do
    out[#out + 1] = {m.id, m.seq, m.expires, m.wants, m.has, m.used}
  end
  return out
end

if op == 'set' then
  -- ARGV[4..]: field, value pairs; 'total' in permits resets the effective total
  local cfg, found = read_cfg()
  local members = live_members(cfg)
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
  if redis.call('HDEL', MEMBERS, id) == 1 and redis.call('EXISTS', CFG) == 1 then
    freed({})  -- hard: nothing says how the member spent its space
  end
  return {1}
end

-- refresh: ARGV[4] id, [5] wants_m, [6] has_m, [7] used_m, [8] throttled (the
-- provider refused while the member kept its share), [9] its pieces ("start
-- length start length ..."), [10] "paced" if it paces its permits (else ""),
-- [11..] the configuration to create the resource with if it does not exist:
-- the one the member last saw stored (it has a version), or the one it was
-- given and never saw stored
local wants, reported, used, throttled = tonumber(ARGV[5]), tonumber(ARGV[6]),
  tonumber(ARGV[7]), tonumber(ARGV[8])
local paced = ARGV[10] == 'paced'
local cfg, found = read_cfg()
if not found then
  if #ARGV < 11 then return {0} end
  for i = 11, #ARGV, 2 do
    redis.call('HSET', CFG, ARGV[i], ARGV[i + 1])
    cfg[ARGV[i]] = ARGV[i + 1]
  end
  cfg.seq = '0'
  redis.call('HSET', CFG, 'seq', 0)
  if cfg.version then
    -- rebuilt from what a member knew: where the members spend is not known yet
    rebuild(cfg)
  else
    -- created from a member's configuration, as set creates it: a member that
    -- started before its Redis answered joins with its first reply (one that
    -- spends a safe share meanwhile starts a rebuild below, as any newcomer
    -- that holds space does)
    cfg.version, cfg.eff_m = '1', tostring(num(cfg, 'total') * 1000)
    redis.call('HSET', CFG, 'version', 1, 'eff_m', cfg.eff_m)
  end
end

local members = live_members(cfg)
local me
for _, m in ipairs(members) do
  if m.id == id then me = m end
end
if not me then
  local seq = redis.call('HINCRBY', CFG, 'seq', 1)
  cfg.seq = tostring(seq)
  me = {id = id, seq = seq, has = 0, safe = 0, pieces = {}}
  members[#members + 1] = me
  table.sort(members, function(a, b) return a.seq < b.seq end)
  if reported > 0 then rebuild(cfg) end  -- it spends space this script forgot
end
me.expires = now + num(cfg, 'lease_ms')
local fell = (me.wants or 0) - wants  -- how far its demand fell since its last report
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
-- the demand-based algorithms hand out what nobody wants in n + 1 equal parts,
-- one left for a member that joins (alloc.with_spare)
if cfg.algorithm == 'fair_share' or cfg.algorithm == 'proportional_share' then
  local demand = 0
  for _, w in ipairs(all_wants) do demand = demand + w end
  if demand < total then
    local n = #all_wants + 1
    local base = fdiv(total - demand, n)
    target = target + base + ((mine <= total - demand - base * n) and 1 or 0)
  end
end
local grant = math.max(0, math.min(target, total - others))
local taken = {}
for _, m in ipairs(members) do
  if m ~= me then
    for _, p in ipairs(m.pieces) do taken[#taken + 1] = p end
  end
end
-- a member granted less than half its due (it joined, or its demand came
-- back) while others hold the rest, or whose demand fell by a tenth of the
-- total (what it gives up is the others' due): the others are asked to refresh
-- now rather than at their next interval (a message as a change of the total
-- to itself), at most 16 times an interval; one left behind asks again soon
-- (the reply's target)
if (grant * 2 < target or fell * 10 >= total) and now >= num(cfg, 'rebuild_ms')
    and now - num(cfg, 'nudge_ms') >= fdiv(refresh_ms, 16) then
  cfg.nudge_ms = tostring(now)
  redis.call('HSET', CFG, 'nudge_ms', now)
  redis.call('PUBLISH', channel, string.format('%s %d %d', cfg.version or '0', total, total))
end
if now < num(cfg, 'rebuild_ms') then
  grant = math.min(grant, reported)
  if #me.pieces == 0 then  -- where it says it spends, if that is sound and free
    local said, nums, free = {}, {}, true
    for x in string.gmatch(ARGV[9] or '', '%-?%d+') do
      if #nums >= 2 * MAX_PIECES then free = false break end
      nums[#nums + 1] = tonumber(x)
    end
    for k = 1, #nums - 1, 2 do said[#said + 1] = {nums[k], nums[k + 1]} end
    for i, p in ipairs(said) do
      if p[1] < 0 or p[2] <= 0 or p[1] + p[2] > total then free = false end
      for j, q in ipairs(said) do
        if i ~= j and q[1] < p[1] + p[2] and p[1] < q[1] + q[2] then free = false end
      end
      for _, q in ipairs(taken) do
        if q[1] < p[1] + p[2] and p[1] < q[1] + q[2] then free = false end
      end
    end
    if free then me.pieces = said end
  end
end
local had = me.pieces
me.pieces = place(total, had, grant, taken)
for _, p in ipairs(had) do  -- gave up some of its space?
  local kept = false
  for _, q in ipairs(me.pieces) do
    if q[1] <= p[1] and p[1] + p[2] <= q[1] + q[2] then kept = true end
  end
  if not kept then
    freed(cfg, paced)
    break
  end
end
me.has = 0
local flat = {}
for _, p in ipairs(me.pieces) do
  me.has = me.has + p[2]
  flat[#flat + 1] = p[1]
  flat[#flat + 1] = p[2]
end
-- what it falls back to without Redis: an equal part of the members it sees
-- (or the configured number), within what the others' safe shares leave, so
-- that the members' safe shares add up to at most the total even while some
-- still hold a part of a smaller membership; not more than it had in a rebuild
local safe = math.min(num(cfg, 'safe') * 1000, total)
if cfg.safe == 'equal' then safe = fdiv(total, #members) end
local others_safe = 0
for _, m in ipairs(members) do
  if m ~= me then others_safe = others_safe + m.safe end
end
safe = math.max(0, math.min(safe, total - others_safe))
if now < num(cfg, 'rebuild_ms') then safe = math.min(safe, me.safe) end
me.safe = safe
save(me)

local held = 0
for _, m in ipairs(members) do held = held + m.has end
return {1, me.has, held, flat, #members, now, cfg_list(cfg), me.safe, target}
