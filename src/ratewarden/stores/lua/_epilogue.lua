-- ratewarden: shared tail of every algorithm script.
local state = nil
local raw = redis.call('GET', key)
if raw then
  state = {}
  local at = 1
  while at <= #raw do
    state[#state + 1], at = struct.unpack('>d', raw, at)
  end
end
local allowed, remaining, reset, retry, new = step(state, now, cost)
if mode == 'peek' then
  if allowed == 1 then  -- report the state as it stands, as algorithms.peek does
    local _, now_remaining, now_reset = step(state, now, math.max(limit, burst) + 1)
    remaining, reset = now_remaining, now_reset
  end
elseif new ~= state then
  local ttl_us = (new[1] - now) * tick  -- element 1 is full_at: past it, state means nothing
  if ttl_us > 0 then
    -- packed 100 at a time: unpack() of a long log would overflow Lua's C stack
    local parts = {}
    for first = 1, #new, 100 do
      local last = math.min(first + 99, #new)
      parts[#parts + 1] = struct.pack('>' .. string.rep('d', last - first + 1),
                                      unpack(new, first, last))
    end
    -- With an explicit (test) clock, real time and script time drift apart: keep a
    -- second's margin so a key never expires before its state is full.
    local margin = explicit_now and 1000 or 1
    -- a string, not a number: Redis formats number arguments slowly
    local px = string.format('%d', math.ceil(ttl_us / 1000) + margin)
    redis.call('SET', key, table.concat(parts), 'PX', px)
  else
    redis.call('DEL', key)
  end
end
return {allowed, remaining, reset, retry}
