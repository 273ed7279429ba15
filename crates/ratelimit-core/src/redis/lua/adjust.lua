-- The admin transitions on the stored states (AdminStore::penalize and
-- ::reward, Store::refund and Store::settle). The reference transitions are
-- the `penalize`, `reward` and `refund` functions of each algorithm in Rust
-- (crates/ratelimit-core/src/algorithm/); these reproduce them. Used by
-- admin.lua (one key) and settle.lua (every limit of a request).
--
-- Each transition writes the new state with a provisional TTL of the longest
-- a state can matter (two windows); adjust_once then sets the exact one, or
-- deletes a state that is back to fresh.

-- Back to fresh deletes the state: a write the prelude does not check.
if redis.acl_check_cmd and not redis.acl_check_cmd('del', KEYS[1]) then
  return redis.error_reply('NOPERM the rate limiter needs del on ' .. KEYS[1])
end

local ADJUST = {}

-- The state of `key` without its tag (see tagged_state), nil when none.
local function read_state(call, key, tag)
  local raw = tagged_state(call, key, string.byte(tag))
  if raw and string.sub(raw, 1, 1) == tag then
    return string.sub(raw, 2)
  end
  return raw
end

-- `value` raised by `amount`, to at most `cap` (never lowered).
local function penalized(value, amount, cap)
  return math.max(value, math.min(value + amount, cap))
end

ADJUST['fixed-window'] = function(call, key, now, penalty, amount, limit, window)
  local start, stop, count = fixed_window_current(call, key, now, window)
  if penalty then
    count = penalized(count, amount, 2 * limit)
  else
    count = count - math.min(amount, count)
  end
  rewrite(call, key, fixed_window_text(call, stop - 1, count), 2 * (stop - start), now)
end

ADJUST['sliding-window'] = function(call, key, now, penalty, amount, limit, w)
  local start, previous, current = sliding_window_current(call, key, now, w, limit)
  if penalty then
    current = penalized(current, amount, 2 * limit)
  else
    -- The current window's count first, then the previous one's.
    local from_current = math.min(amount, current)
    current = current - from_current
    previous = previous - math.min(amount - from_current, previous)
  end
  local value = fmt(start + w - 1) .. ' ' .. fmt(previous) .. ' ' .. fmt(current)
  rewrite(call, key, TAG.sliding_window .. value, 2 * w, now)
end

ADJUST['sliding-log'] = function(call, key, now, penalty, amount, limit, window, oldest_first)
  local raw, n = log_read(call, key, now, window)
  local first, base, total, newest = log_window(raw, n, now, window)
  local value
  if penalty then
    -- Logged now, as if admitted (log_add: in the newest entry when it shares
    -- the slot).
    local add = math.min(amount, positive(2 * limit - total))
    if add == 0 then
      return
    end
    local _
    _, value = log_add(raw, n, first, base, total, newest, now, add, log_slot(limit, window))
  elseif oldest_first then
    -- A refund cannot tell its own units from a later request's: the oldest
    -- go, which leave the window first anyway, so the log counts at least
    -- what it would have without the refunded request, never less.
    if amount >= total then
      rewrite(call, key, nil, 0, now)
      return
    end
    local gone = base + amount
    local j = log_reach(raw, first, n, gone + 1)
    value = log_value(raw, j, n, gone)
  else
    -- The most recent units first: the oldest `keep` units stay, up to the
    -- entry where they end, found as a denial's is.
    local keep = total - amount
    if keep <= 0 then
      rewrite(call, key, nil, 0, now)
      return
    end
    local j = log_reach(raw, first, n, base + keep)
    value = log_value(raw, first, j - 1, base, log_at(raw, j), base + keep)
  end
  rewrite(call, key, LOG_TAG .. value, window, now)
end

-- The bucket's content in token-µs: whole tokens and the progress toward the
-- next one, at most a full bucket, negative in debt (a refill time ahead of
-- now).
ADJUST['token-bucket'] = function(call, key, now, penalty, amount, capacity, interval)
  local span = capacity * interval
  local level = span
  local raw = read_state(call, key, TAG.token_bucket)
  if raw then
    local s = ints(raw)
    level = math.min(s[1] * interval + now - s[2], span)
  end
  if penalty then
    -- At most one full bucket of debt.
    level = math.min(level, math.max(level - amount * interval, -span))
  else
    level = math.min(level + amount * interval, span)
  end
  if level >= span then
    rewrite(call, key, nil, 0, now)
    return
  end
  local tokens, last = 0, now - level
  if level >= 0 then
    tokens = idiv(level, interval)
    last = now - (level - tokens * interval)
  end
  rewrite(call, key, TAG.token_bucket .. fmt(tokens) .. ' ' .. fmt(last), 2 * span, now)
end

-- GCRA and the leaky bucket: the TAT moves, to at most two full bursts ahead.
local function adjust_tat(call, key, now, penalty, amount, capacity, interval)
  local tat = tonumber(read_state(call, key, TAG.tat) or '0')
  local span = capacity * interval
  if penalty then
    local moved = math.max(tat, now) + amount * interval
    tat = math.max(tat, math.min(moved, now + 2 * span))
  else
    tat = tat - amount * interval
    if tat <= now then
      rewrite(call, key, nil, 0, now)
      return
    end
  end
  rewrite(call, key, TAG.tat .. fmt(tat), 2 * span, now)
end
ADJUST['gcra'] = adjust_tat
ADJUST['leaky-bucket'] = adjust_tat

-- Applies `operation` ('penalize', 'reward' or 'refund'; 'peek': none)
-- of `amount` to the state at `key` under `algorithm` (an entry of ADJUST)
-- and its parameters `p1`, `p2`, once per `id` (remembered at `applied`,
-- see applied_ids), and answers what a peek then reports, block included:
-- allowed, limit, remaining, reset_after, retry_after, delay.
local function adjust_once(call, key, applied, id, operation, algorithm, amount, p1, p2, now)
  local ids, done, lived = '', true, 0
  if operation ~= 'peek' then
    ids, done = applied_ids(applied, id)
    lived = redis.call('PTTL', key)
  end
  if not done then
    ADJUST[algorithm](call, key, now, operation == 'penalize', amount, p1, p2, operation == 'refund')
  end
  local ok, limit, remaining, reset, retry, delay = ALGORITHMS[algorithm](call, key, now, 0, p1, p2, '')
  if operation == 'peek' then
    -- Nothing written: the key keeps the TTL its last write gave it.
    if call.block_end > now then
      return blocked_reply(call.block_end - now, ok, limit, retry, reset)
    end
    return ok, limit, remaining, reset, retry, delay
  end
  -- The exact TTL now, or no state when it is back to fresh; a block keeps
  -- the key at least until it ends.
  if call.block_end > now then
    local left = call.block_end - now
    redis.call('PEXPIRE', key, ttl_ms(call, math.max(reset, left)))
    ok, limit, remaining, reset, retry, delay = blocked_reply(left, ok, limit, retry, reset)
  elseif reset > 0 then
    redis.call('PEXPIRE', key, ttl_ms(call, reset))
  else
    redis.call('DEL', key)
  end
  if not done then
    remember_applied(applied, ids, id, math.max(lived, redis.call('PTTL', key)))
  end
  return ok, limit, remaining, reset, retry, delay
end
