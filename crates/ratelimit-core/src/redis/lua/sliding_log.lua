-- Sliding window log: at most `limit` in any interval of length `window`.
-- State (sorted set): one member "<t>:<cost>:<before>" per entry, scored t:
-- `cost` units logged at t, and `before` the units logged before this entry
-- (a running sum). The units in the window are then read from the oldest and
-- the newest member, and the entry a denied request waits for is found by a
-- binary search: no call reads the whole log.
--
-- The log is bounded as in the Rust reference (LOG_SLOTS in
-- algorithm/sliding_window_log.rs): up to a limit of LOG_SLOTS one entry per
-- microsecond (exact); above, one entry per slot of ceil(window / LOG_SLOTS)
-- µs, stamped with its latest admission. A log holds at most 2 × LOG_SLOTS
-- members, so trimming, a reward and a refund touch at most that many.
-- Members never collide: one per time.
local LOG_SLOTS = 1024
-- Running sums are renumbered from 0 past this (2^48; at most 2^41 units
-- are logged at once, so every sum stays exact).
local LOG_REBASE = 281474976710656

-- "t:cost:before" -> {t, cost, before, member}; `before` is nil in members
-- written before running sums (renumbered when met, see log_read).
local function log_entry(member)
  local p = ints(member)
  return {t = p[1], cost = p[2], before = p[3], member = member}
end

local function log_member(t, cost, before)
  return fmt(t) .. ':' .. fmt(cost) .. ':' .. fmt(before)
end

-- Replaces entry `e` by (t, cost, before). The new member is added before the
-- old one is removed: removing a key's only member would delete the key, and
-- adding would recreate it without its TTL.
local function log_rewrite(key, e, t, cost, before)
  local member = log_member(t, cost, before)
  if member ~= e.member then
    redis.call('ZADD', key, fmt(t), member)
    redis.call('ZREM', key, e.member)
  end
end

-- Rewrites every member with running sums from 0: once for a log written
-- before running sums (as costly as every call used to be), and once every
-- 2^48 units for a log that never empties.
local function log_renumber(key)
  local sum = 0
  for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    local e = log_entry(member)
    log_rewrite(key, e, e.t, e.cost, sum)
    sum = sum + e.cost
  end
end

local function log_at(key, rank)
  local member = redis.call('ZRANGE', key, rank, rank)[1]
  if member then
    return log_entry(member)
  end
  return nil
end

-- Drops the entries that left the window (an entry logged at t counts during
-- [t, t + window)); returns the oldest and newest entries left (nil when
-- none) and the units they hold. `first`: the log's first member as
-- check_members read it (nil: the log is empty, nothing to read); when it is
-- still in the window, so is every other entry, and nothing is trimmed.
local function log_read(key, now, window, first)
  if not first then
    return nil, nil, 0
  end
  local oldest = log_entry(first)
  if oldest.t <= now - window then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - window))
    oldest = log_at(key, 0)
    if not oldest then
      return nil, nil, 0
    end
  end
  local newest = log_at(key, -1)
  if not oldest.before or not newest.before or oldest.before > LOG_REBASE then
    log_renumber(key)
    oldest, newest = log_at(key, 0), log_at(key, -1)
  end
  return oldest, newest, newest.before + newest.cost - oldest.before
end

-- The oldest entry by whose leaving at least `need` units of the log have
-- left (need at most what the log holds): a galloping then binary search
-- over ranks (ZRANGE only, within the documented ACL), at most 2 × 12 reads
-- of one member for 2 × LOG_SLOTS members.
local function log_find(key, oldest, need)
  if oldest.cost >= need then
    return oldest
  end
  local target = oldest.before + need
  local function enough(rank)
    local e = log_at(key, rank)
    return e == nil or e.before + e.cost >= target
  end
  -- Ranks below lo fall short; rank hi suffices (or lies past the end).
  local lo, hi = 1, 1
  while not enough(hi) do
    lo = hi + 1
    hi = 2 * hi
  end
  while lo < hi do
    local mid = idiv(lo + hi, 2)
    if enough(mid) then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return log_at(key, lo) or log_at(key, -1)
end

-- The width in µs of the slots whose admissions share one entry.
local function log_slot(limit, window)
  if limit > LOG_SLOTS then
    return idiv(window + LOG_SLOTS - 1, LOG_SLOTS)
  end
  return 1
end

-- Logs `units` at `now` after `newest` (nil: an empty log): in `newest` when it
-- lies in the same slot or later (the clock stepped back), moved to the later
-- time. Returns the entry's time.
local function log_add(key, newest, now, units, slot)
  if newest and (newest.t >= now or idiv(newest.t, slot) == idiv(now, slot)) then
    local t = math.max(newest.t, now)
    log_rewrite(key, newest, t, newest.cost + units, newest.before)
    return t
  end
  local before = 0
  if newest then
    before = newest.before + newest.cost
  end
  redis.call('ZADD', key, fmt(now), log_member(now, units, before))
  return now
end

ALGORITHMS['sliding-log'] = function(key, now, cost, limit, window)
  local oldest, newest, total = log_read(key, now, window, check_members(key, 'log'))
  local function reset_from(e)
    if e then
      return positive(e.t + window - now)
    end
    return 0
  end
  if total + cost > limit then
    local retry = window
    if oldest then
      retry = log_find(key, oldest, total + cost - limit).t + window - now
    end
    -- A penalty (admin.lua) may have pushed the total past the limit.
    return {0, limit, positive(limit - total), reset_from(newest), retry, 0}
  end
  if cost == 0 then
    return {1, limit, limit - total, reset_from(newest), 0, 0}
  end
  local slot = log_slot(limit, window)
  -- The entry's time, as log_add will choose it.
  local t = now
  if newest and (newest.t >= now or idiv(newest.t, slot) == idiv(now, slot)) then
    t = math.max(newest.t, now)
  end
  local reset = positive(t + window - now)
  local r = {1, limit, limit - total - cost, reset, 0, 0}
  r.entry_time = t
  r.commit = function()
    log_add(key, newest, now, cost, slot)
    expire_or_delete(key, reset)
  end
  return r
end
