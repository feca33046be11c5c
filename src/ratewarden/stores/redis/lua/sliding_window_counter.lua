-- Sliding window counter. State: {full_at, prev, curr}; the window ends at
-- full_at - period when curr > 0, else at full_at.
-- The state rolled to the window that holds now: that window's end, the
-- previous window's count and this one's. The settle and the two-tier sync
-- scripts, which hold this file, roll it the same way.
local function swc_roll(state, now)
  local window_end, prev, curr
  if not state then
    window_end, prev, curr = fdiv(now, period) * period + period, 0, 0
  else
    prev, curr = state[2], state[3]
    window_end = state[1]
    if curr > 0 then window_end = state[1] - period end
    if now >= window_end then
      if now < window_end + period then prev = curr else prev = 0 end
      curr = 0
      window_end = fdiv(now, period) * period + period
    end
  end
  return window_end, prev, curr
end

local function step(state, now, cost)
  local window_end, prev, curr = swc_roll(state, now)
  local weighted = prev * (window_end - now)
  local remaining = limit - curr
  if weighted > 0 then remaining = remaining + fdiv(-weighted, period) end
  if weighted + (curr + cost) * period <= span then
    local full_at = window_end + period
    return 1, remaining - cost, full_at - now, 0, {full_at, prev, curr + cost}
  end
  local retry = -1
  if cost <= limit then
    local room = limit - curr - cost
    local t = window_end
    if room >= 0 and prev > 0 then t = window_end - fdiv(room * period, prev) end
    if t >= window_end then
      t = window_end
      if curr > 0 then
        t = math.max(window_end, window_end + period - fdiv((limit - cost) * period, curr))
      end
    end
    retry = t - now
  end
  local full_at = now
  if curr > 0 then full_at = window_end + period elseif prev > 0 then full_at = window_end end
  local reset = 0
  if prev > 0 or curr > 0 then reset = full_at - now end
  return 0, remaining, reset, retry, {full_at, prev, curr}
end
