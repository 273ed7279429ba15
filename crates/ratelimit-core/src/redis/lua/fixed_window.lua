-- Fixed window: at most `limit` per window aligned on the clock.
-- State (string): "<window start> <count>".
ALGORITHMS['fixed-window'] = function(key, now, cost, limit, window)
  local aligned = idiv(now, window) * window
  local start, count = aligned, 0
  local raw = redis.call('GET', key)
  if raw then
    local s = ints(raw)
    -- A count from a later window (the server clock stepped back) is kept.
    if s[2] > 0 and s[1] >= aligned then
      start, count = s[1], s[2]
    end
  end
  local until_end = start + window - now
  if count + cost > limit then
    return {0, limit, limit - count, until_end, until_end, 0}
  end
  count = count + cost
  local reset = 0
  if count > 0 then
    reset = until_end
  end
  local r = {1, limit, limit - count, reset, 0, 0}
  if cost > 0 then
    r.commit = function()
      save_string(key, fmt(start) .. ' ' .. fmt(count), reset)
    end
  end
  return r
end
