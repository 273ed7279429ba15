-- Sorted-set states (sliding log, concurrency).
-- Whether the sorted set `key` is missing or holds members of `family`:
-- 'permits' (concurrency) "<permit id>:<units>", the id 32 hex digits
-- (PermitId's Display), or 'log' (sliding log) "<t>:<cost>", t below 2^53, so
-- at most 16 digits. Every member of a key comes from one family: the first
-- one tells.
local function holds_members(key, family)
  local first = redis.pcall('ZRANGE', key, 0, 0)
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

-- A conflict unless `key` is missing or a sorted set of `family`.
local function check_members(key, family)
  if not holds_members(key, family) then
    conflict(key)
  end
end

local function expire_or_delete(key, reset)
  if reset > 0 then
    redis.call('PEXPIRE', key, ttl_ms(reset))
  else
    redis.call('DEL', key)
  end
end
