-- ratewarden: settling a reservation, per algorithm; mirrors
-- ratewarden/algorithms/settle.py exactly (its docstring says what each case means).
-- MARK[name](new_state, now): the window a reservation was counted in.
-- SETTLE[name](state, now, delta, mark, estimate): the state with
-- delta = actual - estimate applied (state itself when nothing changes). The fixed window calls `step`, the
-- algorithm's own step joined before this file, at cost 0 to roll to now's window.
local MARK, SETTLE = {}, {}

local function window_mark(new) return new[1] end

MARK.fixed_window = window_mark
SETTLE.fixed_window = function(state, now, delta, mark)
  local _, _, _, _, rolled = step(state, now, 0)
  local window_end, used = rolled[1], rolled[2]
  if delta > 0 then return {window_end, math.min(used + delta, limit)} end
  if window_end ~= mark then return state end
  return {window_end, math.max(used + delta, 0)}
end

MARK.sliding_window_counter = function(new) return new[1] - period end
SETTLE.sliding_window_counter = function(state, now, delta, mark)
  local window_end, prev, curr = swc_roll(state, now)
  if delta > 0 then
    local weighted = prev * (window_end - now)
    local room = limit - curr
    if weighted > 0 then room = room + fdiv(-weighted, period) end
    curr = curr + math.min(delta, math.max(room, 0))
  elseif window_end == mark then
    curr = math.max(curr + delta, 0)
  else
    return state
  end
  local full_at = now
  if curr > 0 then full_at = window_end + period elseif prev > 0 then full_at = window_end end
  return {full_at, prev, curr}
end

MARK.sliding_window_log = function(new, now) return now end
SETTLE.sliding_window_log = function(state, now, delta, mark, estimate)
  local live = {}
  if state then
    for i = 2, #state do
      if state[i] > now then live[#live + 1] = state[i] end
    end
  end
  if delta > 0 then
    local added = math.min(delta, math.max(limit - #live, 0))
    for _ = 1, added do live[#live + 1] = now + period end
  else
    local expiry, gone, kept = mark + period, -delta, {}
    for i = 1, #live do
      if gone > 0 and live[i] == expiry then gone = gone - 1 else kept[#kept + 1] = live[i] end
    end
    if gone == -delta then return state end  -- the reservation's entries have left
    live = kept
  end
  if #live == 0 then return {now} end
  local new = {live[#live]}
  for i = 1, #live do new[i + 1] = live[i] end
  return new
end

MARK.bucket = MARK.sliding_window_log
SETTLE.bucket = function(state, now, delta, mark, estimate)
  local debt = 0
  if state and state[1] > now then debt = (state[1] - now) * scale - state[2] end
  local change = delta * unit
  if delta < 0 then  -- no more than what of the estimate has not drained since mark
    change = math.max(change, math.min(0, (now - mark) * scale - estimate * unit))
  end
  local new_debt = math.min(math.max(debt + change, 0), 2 * capacity)
  if new_debt == debt then return state end
  if new_debt == 0 then return {now, 0} end
  local wait = -fdiv(-new_debt, scale)
  return {now + wait, wait * scale - new_debt}
end

MARK.token_bucket_interval = window_mark
SETTLE.token_bucket_interval = function(state, now, delta, mark)
  local refill_at, left
  if not state or now >= state[1] then
    refill_at, left = now + period, burst
  else
    refill_at, left = state[1], state[2]
  end
  if delta > 0 then return {refill_at, math.max(left - delta, 0)} end
  if refill_at ~= mark then return state end
  return {refill_at, math.min(left - delta, burst)}
end
