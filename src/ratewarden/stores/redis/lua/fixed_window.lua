-- Fixed window aligned to the epoch. State: {window_end, used}.
local function step(state, now, cost)
  local window_end, used
  if state and now < state[1] then
    window_end, used = state[1], state[2]
  else
    window_end, used = fdiv(now, period) * period + period, 0
  end
  local count = used + cost
  if count <= limit then
    return 1, limit - count, window_end - now, 0, {window_end, count}
  end
  local wait = window_end - now
  local retry = -1
  if cost <= limit then retry = wait end
  if used > 0 then
    return 0, limit - used, wait, retry, state
  end
  return 0, limit, 0, retry, {now, 0}
end
