-- Fixed window: at most `limit` per window aligned on the clock, or per
-- calendar period (fixed_window_bounds: calendar.lua, which comes first).
-- State (string, tag TAG.fixed_window): "<window's last µs> <count>" (any
-- time in the window reads alike under its own length; see
-- FixedWindow::current in Rust).
local FIXED_WINDOW_BYTE = 102 -- string.byte(TAG.fixed_window)

-- The state's text starts with the text of its window's last µs, "f<last> "
-- (fixed_window_prefix), kept in the call's context (call.fw_last,
-- call.fw_prefix): the decision of a key reads and writes the same one, and
-- the keys of a batch mostly share it. A state that starts with it is read
-- without a pattern: one plain find and the count.
local function fixed_window_prefix(call, last)
  if last ~= call.fw_last then
    call.fw_last, call.fw_prefix = last, 'f' .. fmt(last) .. ' '
  end
  return call.fw_prefix
end

-- The state's text for `count` in the window whose last µs is `last`.
local function fixed_window_text(call, last, count)
  return fixed_window_prefix(call, last) .. fmt(count)
end

-- The window start, end and count that apply at `now`. A count written
-- under another window length counts in the window of this length that
-- holds the last µs of the window that wrote it (FixedWindow::current in
-- Rust).
local function fixed_window_current(call, key, now, window)
  local aligned, stop = fixed_window_bounds(now, window)
  local raw = tagged_state(call, key, FIXED_WINDOW_BYTE)
  if raw then
    -- The common case: the state's window is the current one.
    local prefix = fixed_window_prefix(call, stop - 1)
    if string.find(raw, prefix, 1, true) == 1 then
      return aligned, stop, number(string.sub(raw, #prefix + 1))
    end
    local last, count = state_numbers2(raw, number, number)
    if last == stop - 1 then
      return aligned, stop, count
    end
    local start, state_stop = fixed_window_bounds(last, window)
    -- A count from a later window (the server clock stepped back) is kept.
    if count > 0 and start >= aligned then
      return start, state_stop, count
    end
  end
  return aligned, stop, 0
end

ALGORITHMS['fixed-window'] = function(call, key, now, cost, limit, window)
  local _, stop, count = fixed_window_current(call, key, now, window)
  local until_end = stop - now
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
    local text = fixed_window_text(call, stop - 1, count)
    return 1, limit, limit - count, reset, 0, 0, key, false, text, reset
  end
  return 1, limit, limit - count, reset, 0, 0
end
