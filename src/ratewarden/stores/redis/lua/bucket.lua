-- Continuous bucket: token bucket = leaky bucket meter = GCRA. State: {full_at, rem};
-- the bucket is full at the scaled tick full_at * scale - rem.
local function step(state, now, cost)
  local debt = 0
  if state and state[1] > now then debt = (state[1] - now) * scale - state[2] end
  local new_debt = debt + cost * unit
  if new_debt <= capacity then
    local wait = -fdiv(-new_debt, scale)
    return 1, fdiv(capacity - new_debt, unit), wait, 0, {now + wait, wait * scale - new_debt}
  end
  local retry = -1
  if cost <= burst then retry = -fdiv(capacity - new_debt, scale) end
  if debt == 0 then
    return 0, burst, 0, retry, {now, 0}
  end
  -- a settled over-run can leave the bucket in debt: none remain
  return 0, math.max(fdiv(capacity - debt, unit), 0), state[1] - now, retry, state
end
