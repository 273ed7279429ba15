-- Sliding window counter: the previous window's count weighted by its overlap
-- with the sliding window, plus the current window's count. Everything is
-- scaled by the window length to stay in integers.
-- State (string, tag TAG.sliding_window):
-- "<window's last µs> <previous> <current>" (any time in the window reads
-- alike under its own length; see SlidingWindowCounter::current in Rust).
local SLIDING_WINDOW_BYTE = 119 -- string.byte(TAG.sliding_window)
local SLIDING_WINDOW_STATE = 'w%d %d %d'

-- As state_numbers2 (state.lua), for three numbers.
local function state_numbers3(raw, parse)
  local a, b, c = string.match(raw, '(%d+)%D+(%d+)%D+(%d+)')
  if a then
    return parse(a), parse(b), parse(c)
  end
  local s = ints(raw)
  return s[1], s[2], s[3]
end

-- The window start and the previous and current counts that apply at `now`.
-- A state written under other numbers (SlidingWindowCounter::current in
-- Rust): its counts belong to the window of this length that holds the last
-- µs of the window that wrote them, and counts above twice the limit count
-- as twice the limit.
local function sliding_window_current(call, key, now, w, limit)
  local aligned = idiv(now, w) * w
  local raw = tagged_state(call, key, SLIDING_WINDOW_BYTE)
  if raw then
    -- Window starts and counts repeat across keys.
    local start, previous, current = state_numbers3(raw, number)
    start = idiv(start, w) * w
    previous, current = math.min(previous, 2 * limit), math.min(current, 2 * limit)
    if previous == 0 and current == 0 then
      -- empty: fresh
    elseif start + w < aligned then
      -- older than the previous window: fresh
    elseif start + w == aligned then
      return aligned, current, 0
    else
      -- the same window, or a later one if the server clock stepped back
      return start, previous, current
    end
  end
  return aligned, 0, 0
end

-- When counts `p` and `c` of the window from `start` are all forgotten.
-- (A function of its own, not a closure in the decision: a closure is
-- created again on every call.)
local function sliding_window_reset(start, w, now, p, c)
  if c > 0 then
    return positive(start + 2 * w - now)
  elseif p > 0 then
    return positive(start + w - now)
  end
  return 0
end

ALGORITHMS['sliding-window'] = function(call, key, now, cost, limit, w)
  local start, previous, current = sliding_window_current(call, key, now, w, limit)
  local elapsed = positive(now - start)
  -- The counts' window may start after `now` (written in a longer window).
  local ahead = positive(start - now)
  local weighted = previous * (w - elapsed)
  local budget = limit * w
  if weighted + (current + cost) * w <= budget then
    current = current + cost
    local reset = sliding_window_reset(start, w, now, previous, current)
    local remaining = idiv(budget - weighted - current * w, w)
    if cost > 0 then
      local value = string.format(SLIDING_WINDOW_STATE, start + w - 1, previous, current)
      return 1, limit, remaining, reset, 0, 0, key, false, value, reset
    end
    return 1, limit, remaining, reset, 0, 0
  end
  local remaining = idiv(positive(budget - weighted - current * w), w)
  local retry
  if current + cost <= limit then
    -- Passes later in this window, once the previous window's weight decays.
    local allowance = idiv((limit - current - cost) * w, previous)
    if allowance > w then
      allowance = w
    end
    retry = (w - allowance) - elapsed + ahead
  else
    -- Passes in the next window, where `current` becomes the previous count.
    local allowance = idiv((limit - cost) * w, current)
    if allowance > w then
      allowance = w
    end
    retry = (w - elapsed) + (w - allowance) + ahead
  end
  return 0, limit, remaining, sliding_window_reset(start, w, now, previous, current), retry, 0
end
