-- Sliding window log. State: {full_at, e1, ..., en}, expiries ascending, full_at = en.
local function step(state, now, cost)
  local live = {}
  if state then
    for i = 2, #state do
      if state[i] > now then live[#live + 1] = state[i] end
    end
  end
  local count = #live
  if count + cost <= limit then
    local expiry = now + period
    local new = {expiry}
    for i = 1, count do new[#new + 1] = live[i] end
    for _ = 1, cost do new[#new + 1] = expiry end
    return 1, limit - count - cost, period, 0, new
  end
  local retry = -1
  if cost <= limit then retry = live[count + cost - limit] - now end
  if count > 0 then
    local new = {live[count]}
    for i = 1, count do new[#new + 1] = live[i] end
    return 0, limit - count, live[count] - now, retry, new
  end
  return 0, limit, 0, retry, {now}
end
