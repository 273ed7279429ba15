-- Fixed window: at most `limit` per window aligned on the clock.
-- State (string, tag TAG.fixed_window): "<window start> <count>".
-- The window start and count that apply at `now`. A window start written
-- under another window length counts in the window of this length that holds
-- it (FixedWindow::current in Rust).
local function fixed_window_current(key, now, window)
  local aligned = idiv(now, window) * window
  local raw = read_state(key, TAG.fixed_window)
  if raw then
    local s = ints(raw)
    local start = idiv(s[1], window) * window
    -- A count from a later window (the server clock stepped back) is kept.
    if s[2] > 0 and start >= aligned then
      return start, s[2]
    end
  end
  return aligned, 0
end

ALGORITHMS['fixed-window'] = function(key, now, cost, limit, window)
  local start, count = fixed_window_current(key, now, window)
  local until_end = start + window - now
  if count + cost > limit then
    -- A penalty (admin.lua) may have pushed the count past the limit.
    return {0, limit, positive(limit - count), until_end, until_end, 0}
  end
  count = count + cost
  local reset = 0
  if count > 0 then
    reset = until_end
  end
  if cost > 0 then
    local value = fmt(start) .. ' ' .. fmt(count)
    return {1, limit, limit - count, reset, 0, 0, key, TAG.fixed_window, value, reset}
  end
  return {1, limit, limit - count, reset, 0, 0}
end
