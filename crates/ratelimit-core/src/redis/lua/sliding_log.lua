-- Sliding window log: at most `limit` in any interval of length `window`.
-- State (string): the tag LOG_TAG, then entries of LOG_WIDTH bytes each,
-- struct.pack(LOG_FORMAT, t, through): entry 0 is the base, whose `through`
-- counts the units logged before entry 1 (its time is unused, 0); entries 1
-- to n, oldest first, at strictly increasing times t (µs), `through` the
-- units logged up to and including the entry since the same origin. An
-- entry's units are its `through` minus the previous entry's, so the units
-- in the window are the newest `through` minus the one before the first
-- entry still in it: a call unpacks a handful of entries (binary searches
-- over times and over `through`), and an allowed one writes the entries
-- still in the window, its own added, in one SET ... PX.
--
-- The log is bounded as in the Rust reference (LOG_SLOTS in
-- algorithm/sliding_window_log.rs): up to a limit of LOG_SLOTS one entry per
-- microsecond (exact); above, one entry per slot of ceil(window / LOG_SLOTS)
-- µs, stamped with its latest admission. A log holds at most 2 × LOG_SLOTS
-- entries (a penalty may log as many units again as the limit), 28 KiB.
-- Entries that left the window are dropped by the next call (its base
-- becomes the `through` of the last one dropped).
local LOG_SLOTS = 1024
-- Counts are renumbered from 0 once the base passes this (2^48; at most 2^42
-- units are in a log at once, so every count stays below 2^53, exact).
local LOG_REBASE = 281474976710656
-- The tag of a log's string, which no other string state starts with (see
-- TAG in state.lua), so each side finds the other a conflict.
local LOG_TAG = 'l'
-- Two unsigned big-endian integers of 7 bytes: times and counts stay below
-- 2^53 (policy validation).
local LOG_FORMAT = '>I7I7'
local LOG_WIDTH = 14

-- Entry i of the log `raw` (0: the base): its time and its `through`.
local function log_at(raw, i)
  local t, through = struct.unpack(LOG_FORMAT, raw, 2 + i * LOG_WIDTH)
  return t, through
end

-- The number of entries of the log `raw` (the base aside), nil when `raw` is
-- no log (another family's string state).
local function log_size(raw)
  local n = (#raw - 1) / LOG_WIDTH - 1
  if string.sub(raw, 1, 1) ~= LOG_TAG or n < 0 or n ~= math.floor(n) then
    return nil
  end
  return n
end

-- The first entry from lo to hi whose field (1: its time, 2: its `through`,
-- both never decreasing) is at least `least`; hi when none is (the caller
-- checks).
local function log_search(raw, lo, hi, field, least)
  return first_reaching(log_at, raw, lo, hi, field, least)
end

-- The first of the n entries of `raw` logged after `edge`, n + 1 when none.
local function log_after(raw, n, edge)
  if n == 0 or log_at(raw, n) <= edge then
    return n + 1
  end
  if log_at(raw, 1) > edge then
    return 1
  end
  return log_search(raw, 2, n, 1, edge + 1)
end

-- The first entry from `first` to n whose `through` reaches `target`; n when
-- none does (the caller checks).
local function log_reach(raw, first, n, target)
  return log_search(raw, first, n, 2, target)
end

-- A log in the previous layout (a sorted set, one member "<t>:<cost>" or
-- "<t>:<cost>:<before>" per entry, scored t), as this layout: rewritten as a
-- string with the entries still in the window and their TTL, so an upgrade
-- neither drops what was admitted nor refuses the key; deleted when none
-- is (a set kept without a TTL would keep none). Returns the new state, nil
-- when there is none. Any other type of key, a semaphore's permits
-- included, is a conflict.
local function log_convert(call, key, now, window)
  local members = redis.pcall('ZRANGE', key, 0, -1)
  if not of_family(members, 'log') then
    conflict(key)
  end
  local parts, through, newest = {struct.pack(LOG_FORMAT, 0, 0)}, 0, nil
  for _, member in ipairs(members) do
    local p = ints(member)
    if p[1] > now - window then
      through = through + p[2]
      newest = p[1]
      parts[#parts + 1] = struct.pack(LOG_FORMAT, newest, through)
    end
  end
  if not newest then
    -- Nothing left, which a longer window never reads again.
    redis.call('DEL', key)
    return nil
  end
  local raw = LOG_TAG .. table.concat(parts)
  redis.call('SET', key, raw, 'PX', ttl_ms(call, newest + window - now))
  return raw
end

-- The log of `key` and its number of entries (nil, 0 when there is none); a
-- conflict when the key holds another family's state.
local function log_read(call, key, now, window)
  return read_entries(call, key, log_convert, log_size, now, window)
end

-- What the log `raw` of n entries holds at `now`: its first entry in the
-- window (n + 1 when none), the `through` before it (the base of what is
-- left), the units in the window and the time of the newest entry (nil when
-- the window is empty).
local function log_window(raw, n, now, window)
  if n == 0 then
    return 1, 0, 0, nil
  end
  local first = log_after(raw, n, now - window)
  if first > n then
    return first, 0, 0, nil
  end
  local newest, through = log_at(raw, n)
  local _, base = log_at(raw, first - 1)
  return first, base, through - base, newest
end

-- A log's value (without its tag): the base `base`, entries `from` to `to`
-- of `raw`, then the entry (t, through) when t is given. Counts are
-- renumbered from 0 once the base passes LOG_REBASE (every 2^48 units of a
-- log that never empties).
local function log_value(raw, from, to, base, t, through)
  local minus = 0
  if base >= LOG_REBASE then
    minus = base
  end
  local kept = ''
  if to >= from and minus == 0 then
    kept = string.sub(raw, 2 + from * LOG_WIDTH, 1 + (to + 1) * LOG_WIDTH)
  elseif to >= from then
    local parts = {}
    for i = from, to do
      local et, eth = log_at(raw, i)
      parts[#parts + 1] = struct.pack(LOG_FORMAT, et, eth - minus)
    end
    kept = table.concat(parts)
  end
  if t then
    return struct.pack(LOG_FORMAT, 0, base - minus) .. kept .. struct.pack(LOG_FORMAT, t, through - minus)
  end
  return struct.pack(LOG_FORMAT, 0, base - minus) .. kept
end

-- The width in µs of the slots whose admissions share one entry.
local function log_slot(limit, window)
  if limit > LOG_SLOTS then
    return idiv(window + LOG_SLOTS - 1, LOG_SLOTS)
  end
  return 1
end

-- Logs `units` at `now` in the window log_window read (the entries before
-- `first` dropped): in the newest entry when it lies in the same slot or
-- later (the clock stepped back), moved to the later time, else in a new
-- one. Returns the time of the entry and the log's new value.
local function log_add(raw, n, first, base, total, newest, now, units, slot)
  if newest and (newest >= now or (slot > 1 and idiv(newest, slot) == idiv(now, slot))) then
    local t = math.max(newest, now)
    return t, log_value(raw, first, n - 1, base, t, base + total + units)
  end
  return now, log_value(raw, first, n, base, now, base + total + units)
end

-- The time of the newest entry of a value log_add returned.
local function log_newest(value)
  return (struct.unpack(LOG_FORMAT, value, #value - LOG_WIDTH + 1))
end

ALGORITHMS['sliding-log'] = function(call, key, now, cost, limit, window)
  local raw, n = log_read(call, key, now, window)
  local first, base, total, newest = log_window(raw, n, now, window)
  if first > 1 and (cost == 0 or total + cost > limit) then
    -- Entries left the window and this call writes no log: they are dropped
    -- now, as the reference drops them on every call, so that a later call
    -- under a longer window (the same name with other numbers) or at an
    -- earlier time (a clock that stepped back) never counts them again.
    rewrite(call, key, LOG_TAG .. log_value(raw, first, n, base), nil, now)
  end
  local reset = 0
  if newest then
    reset = positive(newest + window - now)
  end
  if total + cost > limit then
    local need, retry = total + cost - limit, window
    if newest then
      local t, through = log_at(raw, log_reach(raw, first, n, base + need))
      if through - base >= need then
        retry = t + window - now
      end
    end
    -- A penalty (admin.lua) may have pushed the total past the limit.
    return 0, limit, positive(limit - total), reset, retry, 0
  end
  if cost == 0 then
    return 1, limit, limit - total, reset, 0, 0
  end
  local t, value = log_add(raw, n, first, base, total, newest, now, cost, log_slot(limit, window))
  reset = t + window - now
  -- Written by the caller (write_state, state.lua) as a string state: SET ... PX.
  return 1, limit, limit - total - cost, reset, 0, 0, key, LOG_TAG, value, reset
end

-- Takes back up to `units` from the entry logged at `t` (refund.lua): the
-- entries after it count that many fewer before them. Nothing when no entry
-- has that time any more (it left the window, or moved to a later time with
-- later admissions of its slot: the units then stay, which only denies
-- more), or when the key holds no log.
local function log_refund(call, key, t, units, now)
  local raw = redis.pcall('GET', key)
  if not raw or wrong_type(raw) then
    return
  end
  -- A block in front stays (rewrite).
  raw = unblocked(call, raw)
  if not raw then
    return
  end
  local n = log_size(raw)
  if not n then
    return
  end
  local j = log_after(raw, n, t - 1)
  if j > n or log_at(raw, j) ~= t then
    return
  end
  local _, before = log_at(raw, j - 1)
  local _, through = log_at(raw, j)
  local taken = math.min(units, through - before)
  local parts = {string.sub(raw, 1, 1 + j * LOG_WIDTH)}
  if through - taken > before then
    parts[2] = struct.pack(LOG_FORMAT, t, through - taken)
  end
  for i = j + 1, n do
    local et, eth = log_at(raw, i)
    parts[#parts + 1] = struct.pack(LOG_FORMAT, et, eth - taken)
  end
  rewrite(call, key, table.concat(parts), nil, now)
end
