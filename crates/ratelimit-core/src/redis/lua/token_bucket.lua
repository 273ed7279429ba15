-- Token bucket: bursts up to `capacity`, one token every `interval`.
-- State (string, tag TAG.token_bucket): "<tokens> <last refill>". The refill
-- time advances by whole intervals only, so the fraction of a token earned is
-- never lost. A refill time ahead of now is a debt (see admin.lua).
local TOKEN_BUCKET_BYTE = 116 -- string.byte(TAG.token_bucket)
local TOKEN_BUCKET_STATE = 't%d %d'

ALGORITHMS['token-bucket'] = function(call, key, now, cost, capacity, interval)
  local tokens, last = capacity, now
  local raw = tagged_state(call, key, TOKEN_BUCKET_BYTE)
  if raw then
    -- Token counts repeat across keys, refill times seldom.
    tokens, last = state_numbers2(raw, number, tonumber)
    -- Tokens above the capacity (a larger bucket under the same name) are
    -- a full bucket.
    if tokens > capacity then
      tokens = capacity
    end
    -- `last` ahead of now with tokens in hand (a clock that stepped back):
    -- the tokens pay that debt first.
    if last > now and tokens > 0 then
      local debt, held = last - now, tokens * interval
      if held >= debt then
        local level = held - debt
        tokens = idiv(level, interval)
        last = now - (level - tokens * interval)
      else
        tokens, last = 0, last - held
      end
    end
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
  -- `last` ahead of now with no token left is a debt (an admin penalty):
  -- nothing passes, not even a peek, until the refill pays it back.
  local ahead = positive(last - now)
  local allowed = tokens >= cost and ahead == 0
  if allowed then
    tokens = tokens - cost
  end
  local reset = 0
  if tokens < capacity then
    reset = (capacity - tokens) * interval - progress + ahead
  end
  if not allowed then
    return 0, capacity, tokens, reset, (cost - tokens) * interval - progress + ahead, 0
  end
  if cost > 0 then
    local value = string.format(TOKEN_BUCKET_STATE, tokens, last)
    return 1, capacity, tokens, reset, 0, 0, key, false, value, reset
  end
  return 1, capacity, tokens, reset, 0, 0
end
