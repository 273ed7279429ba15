-- Fixed window: at most `limit` per window aligned on the clock.
-- State (string, tag TAG.fixed_window): "<window start> <count>".
-- The window start and count that apply at `now`. A window start written
-- under another window length counts in the window of this length that holds
-- it (FixedWindow::current in Rust).
local FIXED_WINDOW_BYTE = 102 -- string.byte(TAG.fixed_window)
local FIXED_WINDOW_STATE = 'f%d %d'

local function fixed_window_current(key, now, window)
  local aligned = idiv(now, window) * window
  local raw = tagged_state(key, FIXED_WINDOW_BYTE)
  if raw then
    -- Window starts and counts repeat across keys.
    local start, count = state_numbers2(raw, number, number)
    start = idiv(start, window) * window
    -- A count from a later window (the server clock stepped back) is kept.
    if count > 0 and start >= aligned then
      return start, count
    end
  end
  return aligned, 0
end

ALGORITHMS['fixed-window'] = function(key, now, cost, limit, window)
  local start, count = fixed_window_current(key, now, window)
  local until_end = start + window - now
  if count + cost > limit then
    -- A penalty (admin.lua) may have pushed the count past the limit.
    return 0, limit, positive(limit - count), until_end, until_end, 0
  end
  count = count + cost
  local reset = 0
  if count > 0 then
    reset = until_end
  end
  if cost > 0 then
    local value = string.format(FIXED_WINDOW_STATE, start, count)
    return 1, limit, limit - count, reset, 0, 0, key, false, value, reset
  end
  return 1, limit, limit - count, reset, 0, 0
end
