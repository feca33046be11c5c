-- ratewarden: shared tail of every algorithm script.
local state = nil
local raw = redis.call('GET', key)
if raw then
  state = {}
  for word in string.gmatch(raw, '%S+') do
    state[#state + 1] = tonumber(word)
  end
end
local allowed, remaining, reset, retry, new = step(state, now, cost)
if mode == 'peek' then
  if allowed == 1 then  -- report the state as it stands, as algorithms.peek does
    local _, now_remaining, now_reset = step(state, now, math.max(limit, burst) + 1)
    remaining, reset = now_remaining, now_reset
  end
elseif new ~= state then
  local ttl_us = new[1] - now  -- element 1 is full_at: past it the state means nothing
  if ttl_us > 0 then
    local words = {}
    for i, v in ipairs(new) do
      words[i] = string.format('%.0f', v)  -- tostring would round past 14 digits
    end
    -- With an explicit (test) clock, real time and script time drift apart: keep a
    -- second's margin so a key never expires before its state is full.
    local margin = explicit_now and 1000 or 1
    redis.call('SET', key, table.concat(words, ' '), 'PX', math.ceil(ttl_us / 1000) + margin)
  else
    redis.call('DEL', key)
  end
end
return {allowed, remaining, reset, retry}
