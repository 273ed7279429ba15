-- Merges one region's components into a peer region's Redis, by maximum:
-- replays, duplicates and reordering leave the same state.
--
-- KEYS[1]    `<prefix>:mr:heard:<from>`: when this Redis last heard from
--            the region (its own TIME in µs; the receiving region reads it
--            to tell a stale peer, see heard.lua)
-- KEYS[2..]  the hashes of the keys to merge (see decide.lua)
-- ARGV[1]    the sending region's name
-- ARGV[2]    the TTL of the heard key, in ms
-- ARGV[3]    the fixed time in µs (tests), or 0 for the server's TIME
-- then for each hash: window start, window (µs), the sender's count.
--
-- A count for a window that ended more than one window ago no longer
-- matters and is not written. Each written hash keeps a TTL until the end
-- of the window after the count's (never shortened). Fields of windows
-- before the previous one are dropped. Returns the number of fields raised.

-- idiv and fmt: redis/lua/numbers.lua, which comes first.

local t = redis.call('TIME')
local server_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('SET', KEYS[1], fmt(server_now), 'PX', ARGV[2])

local now = tonumber(ARGV[3])
local fixed = now > 0
if not fixed then
  now = server_now
end
local from = ARGV[1]
local raised = 0
for i = 2, #KEYS do
  local at = 4 + (i - 2) * 3
  local start, w, value = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local ends = start + 2 * w
  if ends > now then
    local field = from .. ':' .. fmt(start)
    local known = tonumber(redis.call('HGET', KEYS[i], field) or '0') or 0
    if value > known then
      redis.call('HSET', KEYS[i], field, fmt(value))
      raised = raised + 1
    end
    local ttl = idiv(ends - now + 999, 1000) + 1000
    if fixed then
      ttl = ttl + 3600000
    end
    local left = redis.call('PTTL', KEYS[i])
    if left < ttl then
      redis.call('PEXPIRE', KEYS[i], fmt(ttl))
    end
    local fields = redis.call('HKEYS', KEYS[i])
    for f = 1, #fields do
      local s = tonumber(string.match(fields[f], ':(%d+)$') or '')
      if s ~= nil and s < start - w then
        redis.call('HDEL', KEYS[i], fields[f])
      end
    end
  end
end
return raised
