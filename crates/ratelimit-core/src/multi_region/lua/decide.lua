-- One decision of a multi-region store, in its own region's Redis.
--
-- A key's state is one hash, `<prefix>:<policy>:{<key>}:mr`, a G-counter:
-- one field `<region>:<window start>` per region and window, holding the
-- cost that region admitted in that window. Only its own region increments
-- a field; peers' fields arrive by merge.lua (merged by maximum).
--
-- KEYS[i]    the hash of check i
-- ARGV[1]    the fixed time in µs (tests), or 0 for the server's TIME
-- ARGV[2]    this region's name
-- ARGV[3]    the number of regions
-- ARGV[4]    S, the number of stale peers, then their S names
-- then for each check: kind (1 fixed window, 2 sliding window counter),
-- limit, window (µs), cost.
--
-- Every check is decided against the global counts: the sums over regions
-- of the current and previous windows' fields, a stale peer's current count
-- raised to its conservative share ceil(limit / regions). When every check
-- passes, each is consumed (own field incremented, hash TTL renewed);
-- otherwise nothing is. The reply: the time, then for each check whether it
-- passes, the window start, the global previous and current counts (before
-- this call), and this region's current count after it.

-- idiv and fmt: redis/lua/numbers.lua, which comes first.

local now = tonumber(ARGV[1])
local fixed = now > 0
if not fixed then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local own = ARGV[2]
local regions = tonumber(ARGV[3])
local stale_count = tonumber(ARGV[4])
local stale = {}
for i = 1, stale_count do
  stale[ARGV[4 + i]] = true
end
local base = 5 + stale_count

local checks = {}
local all_pass = true
for i = 1, #KEYS do
  local at = base + (i - 1) * 4
  local kind, limit = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  local w, cost = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  local start = idiv(now, w) * w
  local share = idiv(limit + regions - 1, regions)
  local fields = redis.call('HGETALL', KEYS[i])
  local previous, current, own_current = 0, 0, 0
  local peer_current = {}
  local expired = {}
  for f = 1, #fields, 2 do
    local region, at_start = string.match(fields[f], '^(.+):(%d+)$')
    local value = tonumber(fields[f + 1]) or 0
    at_start = tonumber(at_start)
    if region == nil then
      -- not a field of this store: ignored
    elseif at_start == start then
      if region == own then
        own_current = value
      else
        peer_current[region] = (peer_current[region] or 0) + value
      end
    elseif at_start == start - w then
      previous = previous + value
    elseif at_start < start - w then
      expired[#expired + 1] = fields[f]
    end
  end
  current = own_current
  for region, value in pairs(peer_current) do
    if stale[region] and value < share then
      value = share
    end
    current = current + value
  end
  for region in pairs(stale) do
    if peer_current[region] == nil and region ~= own then
      current = current + share
    end
  end
  local pass
  if kind == 1 then
    pass = current + cost <= limit
  else
    local p, c = math.min(previous, 2 * limit), math.min(current, 2 * limit)
    pass = p * (w - (now - start)) + (c + cost) * w <= limit * w
  end
  if not pass then
    all_pass = false
  end
  checks[i] = {pass, start, previous, current, own_current, cost, w, expired}
end

local reply = {fmt(now)}
for i = 1, #KEYS do
  local c = checks[i]
  local own_after = c[5]
  if all_pass and c[6] > 0 then
    local ttl = idiv(c[2] + 2 * c[7] - now + 999, 1000) + 1000
    if fixed then
      ttl = ttl + 3600000
    end
    own_after = redis.call('HINCRBY', KEYS[i], own .. ':' .. fmt(c[2]), fmt(c[6]))
    if #c[8] > 0 then
      redis.call('HDEL', KEYS[i], unpack(c[8]))
    end
    redis.call('PEXPIRE', KEYS[i], fmt(ttl))
  end
  local pass = 0
  if c[1] then
    pass = 1
  end
  reply[#reply + 1] = pass
  reply[#reply + 1] = fmt(c[2])
  reply[#reply + 1] = fmt(c[3])
  reply[#reply + 1] = fmt(c[4])
  reply[#reply + 1] = fmt(own_after)
end
return reply
