-- Token bucket: bursts up to `capacity`, one token every `interval`.
-- State (string): "<tokens> <last refill>". The refill time advances by whole
-- intervals only, so the fraction of a token earned is never lost.
ALGORITHMS['token-bucket'] = function(key, now, cost, capacity, interval)
  local tokens, last = capacity, now
  local raw = redis.call('GET', key)
  if raw then
    local s = ints(raw)
    tokens, last = s[1], s[2]
  end
  local added = idiv(positive(now - last), interval)
  if tokens + added >= capacity then
    tokens = capacity
    if now > last then
      last = now
    end
  else
    tokens = tokens + added
    last = last + added * interval
  end
  local progress = positive(now - last)
  local allowed = tokens >= cost
  if allowed then
    tokens = tokens - cost
  end
  local reset = 0
  if tokens < capacity then
    reset = (capacity - tokens) * interval - progress
  end
  if not allowed then
    return {0, capacity, tokens, reset, (cost - tokens) * interval - progress, 0}
  end
  local r = {1, capacity, tokens, reset, 0, 0}
  if cost > 0 then
    r.commit = function()
      save_string(key, fmt(tokens) .. ' ' .. fmt(last), reset)
    end
  end
  return r
end
