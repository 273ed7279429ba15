-- Sorted-set states, the previous layout of the semaphore's permits
-- (concurrency) and of sliding logs, which concurrency.lua and sliding_log.lua
-- convert to their strings when they meet one (sem_convert, log_convert); and
-- what both strings share: a read that converts, a binary search.
-- Whether the members `first` (a ZRANGE reply from `key`, via redis.pcall)
-- belong to `family`: 'permits' (concurrency) "<permit id>:<units>", the id
-- 32 hex digits (PermitId's Display), or 'log' (the old sliding log)
-- "<t>:<cost>:<before>" or "<t>:<cost>", t below 2^53, so at most 16
-- digits. Every member of a key comes from one family: the first one tells.
-- A missing or empty key holds any family; a string state holds none
-- (WRONGTYPE).
local function of_family(first, family)
  if wrong_type(first) then
    return false
  end
  if not first[1] then
    return true
  end
  local id = string.match(first[1], '^(%x+):')
  local permit = id ~= nil and #id == 32
  return permit == (family == 'permits')
end

-- Whether the sorted set `key` is missing or holds members of `family`.
local function holds_members(key, family)
  return of_family(redis.pcall('ZRANGE', key, 0, 0), family)
end

-- The string state of `key` and its number of entries by size(raw) (nil, 0
-- when there is none), a block in front of it noted in call.block_end and
-- cut off; when the key holds a sorted set, what convert(call, key, now, p)
-- makes of it (a string state, written; a sorted set holds no block). A conflict
-- when size finds another family's state; any other error is raised. (One
-- Lua call on the common path: the read is not a helper of its own.)
local function read_entries(call, key, convert, size, now, p)
  local raw = redis.pcall('GET', key)
  call.block_end = 0
  if not raw then
    return nil, 0
  end
  if type(raw) == 'table' and wrong_type(raw) then
    raw = convert(call, key, now, p)
    if not raw then
      return nil, 0
    end
  elseif string.byte(raw) == BLOCK_BYTE then
    -- A block in front (see the prelude): noted, and cut off.
    raw = unblocked(call, raw)
    if not raw then
      return nil, 0
    end
  end
  local n = size(raw)
  if not n then
    conflict(key)
  end
  return raw, n
end

-- The first index from lo to hi whose value `field` (1 or 2) of at(raw, i),
-- never decreasing in i, is at least `least`; hi when none is (the caller
-- checks).
local function first_reaching(at, raw, lo, hi, field, least)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if select(field, at(raw, mid)) >= least then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end
