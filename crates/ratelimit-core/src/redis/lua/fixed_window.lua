-- Fixed window: at most `limit` per window aligned on the clock, or per
-- calendar period (fixed_window_bounds: calendar.lua, which comes first).
-- State (string, tag TAG.fixed_window): "<window's last µs> <count>" (any
-- time in the window reads alike under its own length; see
-- FixedWindow::current in Rust).
local FIXED_WINDOW_BYTE = 102 -- string.byte(TAG.fixed_window)

-- Window ends repeat across keys, and counts are small: the state's text
-- is made of the text of the last window's last µs seen, "f<last> "
-- (FW_PREFIX, for FW_START), and of the count's text, kept for counts up to COUNT_TEXTS.
-- A state that starts with FW_PREFIX is read without a pattern: one plain
-- find and the count. (In the library these live as long as it is loaded;
-- a script makes them again on every call.) Against one string.format of
-- both numbers and one string.match to read them back, this saves Redis
-- about 250 ns per decision (a loop of each inside Redis 7.0's Lua).
local FW_START, FW_PREFIX = -1, '\0'
local COUNT_TEXT, COUNT_TEXTS = {}, 1024

-- The state's text for `count` in the window whose last µs is `start`.
local function fixed_window_text(start, count)
  if start ~= FW_START then
    FW_START, FW_PREFIX = start, 'f' .. fmt(start) .. ' '
  end
  local text = COUNT_TEXT[count]
  if not text then
    text = fmt(count)
    if count <= COUNT_TEXTS then
      COUNT_TEXT[count] = text
    end
  end
  return FW_PREFIX .. text
end

-- The window start, end and count that apply at `now`. A count written
-- under another window length counts in the window of this length that
-- holds the last µs of the window that wrote it (FixedWindow::current in
-- Rust).
local function fixed_window_current(key, now, window)
  local aligned, stop = fixed_window_bounds(now, window)
  local raw = tagged_state(key, FIXED_WINDOW_BYTE)
  if raw then
    local last, count
    if string.find(raw, FW_PREFIX, 1, true) == 1 then
      last, count = FW_START, number(string.sub(raw, #FW_PREFIX + 1))
    else
      last, count = state_numbers2(raw, number, number)
    end
    -- The common case: the state's window is the current one.
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

ALGORITHMS['fixed-window'] = function(key, now, cost, limit, window)
  local _, stop, count = fixed_window_current(key, now, window)
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
    local text = fixed_window_text(stop - 1, count)
    return 1, limit, limit - count, reset, 0, 0, key, false, text, reset
  end
  return 1, limit, limit - count, reset, 0, 0
end
