-- Sliding window counter: the previous window's count weighted by its overlap
-- with the sliding window, plus the current window's count. Everything is
-- scaled by the window length to stay in integers.
-- State (string, tag TAG.sliding_window):
-- "<window start> <previous> <current>".
-- The window start and the previous and current counts that apply at `now`.
-- A state written under other numbers (SlidingWindowCounter::current in
-- Rust): its window start moves back to the start of the window of this
-- length that holds it, and counts above twice the limit count as twice the
-- limit.
local function sliding_window_current(key, now, w, limit)
  local aligned = idiv(now, w) * w
  local raw = read_state(key, TAG.sliding_window)
  if raw then
    local s = ints(raw)
    local start = idiv(s[1], w) * w
    local previous, current = math.min(s[2], 2 * limit), math.min(s[3], 2 * limit)
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

ALGORITHMS['sliding-window'] = function(key, now, cost, limit, w)
  local start, previous, current = sliding_window_current(key, now, w, limit)
  local elapsed = positive(now - start)
  local weighted = previous * (w - elapsed)
  local budget = limit * w
  local function reset_of(p, c)
    if c > 0 then
      return positive(start + 2 * w - now)
    elseif p > 0 then
      return positive(start + w - now)
    end
    return 0
  end
  if weighted + (current + cost) * w <= budget then
    current = current + cost
    local reset = reset_of(previous, current)
    local remaining = idiv(budget - weighted - current * w, w)
    if cost > 0 then
      local value = fmt(start) .. ' ' .. fmt(previous) .. ' ' .. fmt(current)
      return {1, limit, remaining, reset, 0, 0, key, TAG.sliding_window, value, reset}
    end
    return {1, limit, remaining, reset, 0, 0}
  end
  local remaining = idiv(positive(budget - weighted - current * w), w)
  local retry
  if current + cost <= limit then
    -- Passes later in this window, once the previous window's weight decays.
    local allowance = idiv((limit - current - cost) * w, previous)
    if allowance > w then
      allowance = w
    end
    retry = (w - allowance) - elapsed
  else
    -- Passes in the next window, where `current` becomes the previous count.
    local allowance = idiv((limit - cost) * w, current)
    if allowance > w then
      allowance = w
    end
    retry = (w - elapsed) + (w - allowance)
  end
  return {0, limit, remaining, reset_of(previous, current), retry, 0}
end
