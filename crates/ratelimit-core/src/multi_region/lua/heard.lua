-- What this region's Redis holds of each peer, for the sync task's status,
-- logs and metrics (decisions read the same fields themselves).
--
-- KEYS[1..2]  the outbox: by sequence (ZSET), meta (HASH)
-- KEYS[2+i]   `<prefix>:mr:heard:<peer i>` (mark.lua)
-- KEYS[2+P+i] `<prefix>:mr:arrived:<peer i>` (merge.lua)
-- ARGV[i]     the name of peer i
-- Returns the server's TIME in µs, then for each peer: when it was last
-- heard (-1 when never, or so long ago that its hash expired), whether its
-- clock is off by more than allowed, the bounds of that offset (µs, or
-- nothing), the entries of this region's outbox not yet delivered to it,
-- and the units heard from it by policy (as a flat list of pairs).

local t = redis.call('TIME')
local reply = {string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))}
local peers = #ARGV
for i = 1, peers do
  local heard = redis.call('HMGET', KEYS[2 + i], 'at', 'skewed', 'lo', 'hi')
  local cursor = redis.call('HGET', KEYS[2], 'cursor:' .. ARGV[i]) or '0'
  reply[#reply + 1] = heard[1] or '-1'
  reply[#reply + 1] = heard[2] or '0'
  reply[#reply + 1] = heard[3] or ''
  reply[#reply + 1] = heard[4] or ''
  reply[#reply + 1] = redis.call('ZCOUNT', KEYS[1], '(' .. cursor, '+inf')
  reply[#reply + 1] = redis.call('HGETALL', KEYS[2 + peers + i])
end
return reply
