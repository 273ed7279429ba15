-- Sorted-set states: the semaphore's permits (concurrency), and sliding logs
-- in the layout before issue 13, which sliding_log.lua converts when it meets
-- one (log_convert).
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

local function expire_or_delete(key, reset)
  if reset > 0 then
    redis.call('PEXPIRE', key, ttl_ms(reset))
  else
    redis.call('DEL', key)
  end
end
