-- Token bucket refilled to burst once per period. State: {refill_at, left}.
local function step(state, now, cost)
  local refill_at, left
  if not state or now >= state[1] then
    refill_at, left = now + period, burst
  else
    refill_at, left = state[1], state[2]
  end
  local wait = refill_at - now
  if cost <= left then
    return 1, left - cost, wait, 0, {refill_at, left - cost}
  end
  local retry = -1
  if cost <= burst then retry = wait end
  if left == burst then
    return 0, left, 0, retry, {now, left}
  end
  return 0, left, wait, retry, {refill_at, left}
end
