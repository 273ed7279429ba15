-- Sliding window counter: the previous window's count weighted by its overlap
-- with the sliding window, plus the current window's count. Everything is
-- scaled by the window length to stay in integers.
-- State (string, tag TAG.sliding_window):
-- "<window start> <previous> <current>".
-- The window start and the previous and current counts that apply at `now`.
local function sliding_window_current(key, now, w)
  local aligned = idiv(now, w) * w
  local raw = read_state(key, TAG.sliding_window)
  if raw then
    local s = ints(raw)
    if s[2] == 0 and s[3] == 0 then
      -- empty: fresh
    elseif s[1] + w < aligned then
      -- older than the previous window: fresh
    elseif s[1] + w == aligned then
      return aligned, s[3], 0
    else
      -- the same window, or a later one if the server clock stepped back
      return s[1], s[2], s[3]
    end
  end
  return aligned, 0, 0
end

ALGORITHMS['sliding-window'] = function(key, now, cost, limit, w)
  local start, previous, current = sliding_window_current(key, now, w)
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
    local r = {1, limit, idiv(budget - weighted - current * w, w), reset, 0, 0}
    if cost > 0 then
      r.commit = function()
        local value = fmt(start) .. ' ' .. fmt(previous) .. ' ' .. fmt(current)
        write_state(key, TAG.sliding_window, value, reset)
      end
    end
    return r
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
