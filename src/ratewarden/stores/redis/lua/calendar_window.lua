-- Calendar periods (ratewarden/algorithms/calendar.py) by the server's clock.
-- The zone's rules stay in the client: it sends, in place of the constants a
-- fixed window does not read, two periods as their edges in ticks, scale < unit <
-- capacity ([scale, unit) holds the client's time less the allowed skew, [unit,
-- capacity) is the next), and in span its own time in microseconds. The script
-- counts in whichever period holds the server's time; a client clock more than
-- SKEW_US from the server's gets the refusal {0, -1, server now, -1} instead (no
-- count: the client raises ClockSkew); its state is the one it was given, or
-- where there was none an empty one that saving drops (the bodies save a state
-- that is not the one they passed, and pass none as nil or false). Joined after
-- fixed_window.lua, whose step counts inside the period.
local fixed_window_step = step
local SKEW_US = 300000000  -- _script_calls.SKEW_NS, in microseconds

local function step(state, now, cost)
  local off = now * tick - span
  if off > SKEW_US or off < -SKEW_US or now < scale or now >= capacity then
    return 0, -1, now, -1, state or {0, 0}
  end
  if not state or now >= state[1] then
    local window_end = unit
    if now >= unit then window_end = capacity end
    state = {window_end, 0}
  end
  return fixed_window_step(state, now, cost)
end
