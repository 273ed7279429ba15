-- Sliding window log: at most `limit` in any interval of length `window`.
-- State (sorted set): one member "<t>:<cost>" per admission time t, scored t.
-- Requests admitted in the same microsecond share one member, so members
-- never collide.
ALGORITHMS['sliding-log'] = function(key, now, cost, limit, window)
  check_members(key, 'log')
  -- An entry admitted at t counts during [t, t + window).
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - window))
  local members = redis.call('ZRANGE', key, 0, -1)
  local times, costs, total = {}, {}, 0
  for i, member in ipairs(members) do
    local p = ints(member)
    times[i], costs[i] = p[1], p[2]
    total = total + p[2]
  end
  local n = #members
  local newest = times[n]
  local function reset_from(t)
    if t then
      return positive(t + window - now)
    end
    return 0
  end
  if total + cost > limit then
    local need = total + cost - limit
    local freed, retry = 0, window
    for i = 1, n do
      freed = freed + costs[i]
      if freed >= need then
        retry = times[i] + window - now
        break
      end
    end
    -- A penalty (admin.lua) may have pushed the total past the limit.
    return {0, limit, positive(limit - total), reset_from(newest), retry, 0}
  end
  if cost == 0 then
    return {1, limit, limit - total, reset_from(newest), 0, 0}
  end
  -- Keep the log ordered even if the server clock stepped back.
  local t = now
  if newest and newest >= now then
    t = newest
  end
  local reset = reset_from(t)
  local r = {1, limit, limit - total - cost, reset, 0, 0}
  r.entry_time = t
  r.commit = function()
    if t == newest then
      redis.call('ZREM', key, members[n])
      redis.call('ZADD', key, fmt(t), fmt(t) .. ':' .. fmt(costs[n] + cost))
    else
      redis.call('ZADD', key, fmt(t), fmt(t) .. ':' .. fmt(cost))
    end
    expire_or_delete(key, reset)
  end
  return r
end
