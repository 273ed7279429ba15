-- Concurrency (a distributed semaphore): at most `max` units in flight.
-- State (string): the tag SEM_TAG, a base count (7 bytes), then one entry of
-- SEM_WIDTH bytes per held permit, in the order its lease expires (the
-- soonest first): the permit id (SEM_ID bytes: 32 hex digits, PermitId's
-- Display; random, unique across instances), then struct.pack(SEM_FORMAT,
-- expires, through): when the lease expires (µs, server time), and the units
-- held by this entry and every one before it, counted from the same origin
-- as the base. An entry's units are its `through` minus the previous one's
-- (the base's for the first), so the units held are the newest `through`
-- minus the one before the first lease still running: a call unpacks a
-- handful of entries (binary searches over expiries and over `through`),
-- however many permits are held, and an admission writes the leases still
-- running, its own added, in one SET ... PX.
--
-- Every entry holds at least one unit and an admission leaves at most `max`
-- (at most MAX_CONCURRENCY in concurrency.rs) units held, so a state holds
-- at most 1,024 running leases (46 KiB); expired ones are dropped by the
-- next call that meets them.
local SEM_TAG = 'c'
-- Two unsigned big-endian integers of 7 bytes: times and counts stay below
-- 2^53 (policy validation, and the rebase below).
local SEM_FORMAT = '>I7I7'
local SEM_ID = 32
local SEM_WIDTH = 46
-- The tag and the base.
local SEM_HEAD = 8
-- Counts are renumbered from 0 once the base passes this (2^48).
local SEM_REBASE = 281474976710656
-- The value of an empty semaphore: its tag and a base of 0, 7 zero bytes
-- (struct.pack('>I7', 0), which FUNCTION LOAD cannot call: struct is not
-- there while the library loads).
local SEM_EMPTY = SEM_TAG .. '\0\0\0\0\0\0\0'
-- No entry to remove (sem_value's `gone`).
local SEM_NONE = {}

-- Entry i (1 to n) of the semaphore `raw`: its lease's expiry and its
-- `through`.
local function sem_at(raw, i)
  local expires, through = struct.unpack(SEM_FORMAT, raw, SEM_HEAD + (i - 1) * SEM_WIDTH + SEM_ID + 1)
  return expires, through
end

-- The `through` of entry i, the base for i = 0.
local function sem_through(raw, i)
  if i == 0 then
    return (struct.unpack('>I7', raw, 2))
  end
  local _, through = sem_at(raw, i)
  return through
end

-- The number of entries of the semaphore `raw`, nil when `raw` is none
-- (another family's string state).
local function sem_size(raw)
  local n = (#raw - SEM_HEAD) / SEM_WIDTH
  if string.sub(raw, 1, 1) ~= SEM_TAG or n < 0 or n ~= math.floor(n) then
    return nil
  end
  return n
end

-- A semaphore in the previous layout (a sorted set, one member
-- "<permit id>:<units>" per permit, scored by when its lease expires), as
-- this layout: rewritten as a string with the leases still running, their
-- ids, expiries and units kept (a holder can still release its permit), and
-- the TTL of the longest; deleted when none runs. Returns the new state.
-- Any other sorted set (an old sliding log) is a conflict.
local function sem_convert(call, key, now)
  local leases = redis.pcall('ZRANGE', key, 0, -1, 'WITHSCORES')
  if not of_family(leases, 'permits') then
    conflict(key)
  end
  local parts, through, latest = {SEM_EMPTY}, 0, nil
  for i = 1, #leases, 2 do
    local expires = tonumber(leases[i + 1])
    if expires > now then
      local member = leases[i]
      local units = tonumber(string.sub(member, SEM_ID + 2))
      if string.byte(member, SEM_ID + 1) ~= 58 or not units then
        conflict(key)
      end
      through = through + units
      latest = expires
      parts[#parts + 1] = string.sub(member, 1, SEM_ID) .. struct.pack(SEM_FORMAT, expires, through)
    end
  end
  local raw = table.concat(parts)
  if latest then
    redis.call('SET', key, raw, 'PX', ttl_ms(call, latest - now))
  else
    redis.call('DEL', key)
  end
  return raw
end

-- The first of the n entries of `raw` whose lease runs after `now` (n + 1
-- when none does).
local function sem_running(raw, n, now)
  if n == 0 or sem_at(raw, 1) > now then
    return 1
  end
  return first_reaching(sem_at, raw, 2, n + 1, 1, now + 1)
end

-- Appends entries `from` to `to` of `raw` to `parts`, their `through` moved
-- by `shift`.
local function sem_copy(parts, raw, from, to, shift)
  if to < from then
    return
  end
  local start = SEM_HEAD + (from - 1) * SEM_WIDTH + 1
  if shift == 0 then
    parts[#parts + 1] = string.sub(raw, start, SEM_HEAD + to * SEM_WIDTH)
    return
  end
  for i = from, to do
    local expires, through = sem_at(raw, i)
    local at = start + (i - from) * SEM_WIDTH
    parts[#parts + 1] = string.sub(raw, at, at + SEM_ID - 1) .. struct.pack(SEM_FORMAT, expires, through + shift)
  end
end

-- The first entry of `raw` from `first` on whose permit id is `id`, nil
-- when none is: a plain search, which counts a match at an entry's start
-- only.
local function sem_find(raw, first, id)
  local from = SEM_HEAD + (first - 1) * SEM_WIDTH + 1
  while true do
    local at = string.find(raw, id, from, true)
    if not at then
      return nil
    end
    local offset = at - SEM_HEAD - 1
    if offset % SEM_WIDTH == 0 then
      return offset / SEM_WIDTH + 1
    end
    from = at + 1
  end
end

-- A semaphore's value (its tag included) holding entries `first` to n of
-- `raw` (the base `base` is the `through` before `first`), but those in
-- `gone` (a list of entry numbers, in order), and, when `id` is given, a new
-- entry `id` for `units` whose lease expires at `expires`, after every
-- entry expiring no later (with `gone`, `expires` is no sooner than the
-- last of them: a renewal). Counts are renumbered from 0 once the base
-- passes SEM_REBASE.
local function sem_value(raw, first, n, base, gone, id, expires, units)
  local minus = 0
  if base >= SEM_REBASE then
    minus = base
  elseif id and #gone == 0 and (n < first or sem_at(raw, n) <= expires) then
    -- The common admission: appended, the rest copied as it is.
    -- Each value is one concatenation (one new string).
    local through = base + units
    if n >= first then
      through = sem_through(raw, n) + units
    end
    if n == 0 then
      return SEM_EMPTY .. id .. struct.pack(SEM_FORMAT, expires, through)
    elseif first == 1 then
      return raw .. id .. struct.pack(SEM_FORMAT, expires, through)
    end
    return SEM_TAG .. struct.pack('>I7', base) .. string.sub(raw, SEM_HEAD + (first - 1) * SEM_WIDTH + 1)
      .. id .. struct.pack(SEM_FORMAT, expires, through)
  end
  local parts, from, shift = {SEM_TAG, struct.pack('>I7', base - minus)}, first, -minus
  for _, j in ipairs(gone) do
    sem_copy(parts, raw, from, j - 1, shift)
    shift = shift - (sem_through(raw, j) - sem_through(raw, j - 1))
    from = j + 1
  end
  if id then
    local at = n + 1
    if n >= from and sem_at(raw, n) > expires then
      at = first_reaching(sem_at, raw, from, n, 1, expires + 1)
    end
    sem_copy(parts, raw, from, at - 1, shift)
    local before = base
    if at > first then
      before = sem_through(raw, at - 1)
    end
    parts[#parts + 1] = id .. struct.pack(SEM_FORMAT, expires, before + shift + units)
    shift = shift + units
    from = at
  end
  sem_copy(parts, raw, from, n, shift)
  return table.concat(parts)
end

-- Drops the expired entries (before `first`) of the semaphore `raw` of n
-- entries, as the reference drops them on every call, so that a later call
-- at an earlier time (a clock that stepped back) never counts them again.
-- A block read with the state stays in front (rewrite, in the prelude).
local function sem_drop(call, key, raw, first, n, base, now)
  if first > n then
    rewrite(call, key, nil, nil, now)
  else
    rewrite(call, key, sem_value(raw, first, n, base, SEM_NONE), nil, now)
  end
end

ALGORITHMS['concurrency'] = function(call, key, now, cost, max, lease, permit)
  local raw, n = read_entries(call, key, sem_convert, sem_size, now)
  local first, base, held, latest = 1, 0, 0, nil
  if n > 0 then
    first = sem_running(raw, n, now)
    base = sem_through(raw, first - 1)
    if first <= n then
      local newest, through = sem_at(raw, n)
      latest, held = newest, through - base
    end
  end
  local reset = 0
  if latest then
    reset = positive(latest - now)
  end
  -- The permit already held: this is its check sent again (its reply was
  -- lost with its connection), allowed as it was, taking nothing more (a
  -- denial by its own permit would leave the permit to no one).
  local again = cost > 0 and permit and #permit == SEM_ID and first <= n and sem_find(raw, first, permit)
  if first > 1 and (cost == 0 or again or held + cost > max) then
    sem_drop(call, key, raw, first, n, base, now)
  end
  if again then
    return 1, max, positive(max - held), reset, 0, 0
  end
  if held + cost > max then
    -- The soonest leases free enough, found as the first entry whose
    -- `through` covers what is missing.
    local need, retry = held + cost - max, lease
    if held >= need then
      local j = first_reaching(sem_at, raw, first, n, 2, base + need)
      retry = sem_at(raw, j) - now
    end
    -- Permits taken under a larger max (the same name with other numbers)
    -- may hold more than this max: nothing remains until they end.
    return 0, max, positive(max - held), reset, retry, 0
  end
  if cost == 0 then
    return 1, max, max - held, reset, 0, 0
  end
  -- An argument is a string when present.
  if not permit or #permit ~= SEM_ID then
    error({err = 'ERR a concurrency permit id is ' .. SEM_ID .. ' hex digits'})
  end
  local expires = now + lease
  if expires - now > reset then
    reset = expires - now
  end
  local value = sem_value(raw, first, n, base, SEM_NONE, permit, expires, cost)
  -- Written by the caller (write_state, state.lua) as a string state, its tag included:
  -- SET ... PX.
  return 1, max, max - held - cost, reset, 0, 0, key, false, value, reset
end

-- The entries of the permit `id` in the semaphore at `key` at `now`, for a
-- release or a renewal: the state (a block in front stays, see rewrite), its
-- size, its first running entry, the count before it, and the indexes of the
-- id's entries. Nil when the key holds no running permit of ours (another
-- family's state holds none: MemoryStore ignores it too); when the id holds
-- none, the expired entries are dropped on the way.
local function sem_entries(call, key, now, id)
  -- A shorter id would match every permit it begins.
  if type(id) ~= 'string' or #id ~= SEM_ID then
    error({err = 'ERR a concurrency permit id is ' .. SEM_ID .. ' hex digits'})
  end
  local raw = redis.pcall('GET', key)
  call.block_end = 0
  if type(raw) == 'table' and wrong_type(raw) then
    if not holds_members(key, 'permits') then
      return nil
    end
    raw = sem_convert(call, key, now)
  else
    raw = unblocked(call, raw)
  end
  local n = raw and sem_size(raw)
  if not n or n == 0 then
    return nil
  end
  local first = sem_running(raw, n, now)
  local base = sem_through(raw, first - 1)
  local gone, j = {}, first
  while j <= n do
    j = sem_find(raw, j, id)
    if not j then
      break
    end
    gone[#gone + 1] = j
    j = j + 1
  end
  if #gone == 0 then
    if first > 1 then
      sem_drop(call, key, raw, first, n, base, now)
    end
    return nil
  end
  return raw, n, first, base, gone
end

-- Writes the semaphore `value` at `key`, with the TTL of its longest lease
-- (its last entry).
local function sem_write(call, key, value, now)
  local newest = struct.unpack('>I7', value, #value - 2 * 7 + 1)
  rewrite(call, key, value, positive(newest - now), now)
end

-- Releases the permit `id` of `key` at `now` (release.lua; refund.lua gives
-- back a permit this way): every entry of that id leaves, and the state
-- keeps the TTL of its longest lease still running. Returns 1 if the permit
-- was still held, else 0.
local function sem_release(call, key, now, id)
  local raw, n, first, base, gone = sem_entries(call, key, now, id)
  if not raw then
    return 0
  end
  if #gone == n - first + 1 then
    rewrite(call, key, nil, 0, now)
    return 1
  end
  sem_write(call, key, sem_value(raw, first, n, base, gone), now)
  return 1
end

-- Renews the lease of the permit `id` of `key` at `now` (renew.lua): its
-- entries (one, or several under one id, merged) leave and one entry of
-- their units comes back, its lease ending `lease` µs after `now` (never
-- sooner than theirs), in its place in expiry order; the state keeps the TTL
-- of its longest lease. Returns 1 if the permit was still held, else 0: a
-- permit released or expired is never written back, as its units may be
-- another's by now.
local function sem_renew(call, key, now, id, lease)
  if not lease or lease <= 0 or #id ~= SEM_ID then
    error({err = 'ERR a renewal takes a permit id of ' .. SEM_ID .. ' hex digits and a lease'})
  end
  local raw, n, first, base, gone = sem_entries(call, key, now, id)
  if not raw then
    return 0
  end
  local units, expires = 0, now + lease
  for _, j in ipairs(gone) do
    units = units + sem_through(raw, j) - sem_through(raw, j - 1)
    expires = math.max(expires, sem_at(raw, j))
  end
  sem_write(call, key, sem_value(raw, first, n, base, gone, id, expires, units), now)
  return 1
end
