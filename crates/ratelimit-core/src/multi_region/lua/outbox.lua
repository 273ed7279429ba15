-- Reads this region's outbox for one peer, in this region's Redis: the
-- entries (key and window, and this region's count there) written or raised
-- after a sequence number, oldest first, at most a given number.
--
-- KEYS[1..3]  the outbox: by sequence (ZSET), values (HASH), meta (HASH)
-- ARGV[1]     the peer's name
-- ARGV[2]     read after this sequence number; -1 for the peer's cursor
--             (what was delivered to it, in the generation `born` of the
--             peer's Redis; 0 when nothing was, or when the outbox started
--             a new epoch since)
-- ARGV[3]     the most entries to return
-- ARGV[4]     the fixed time in µs (tests), or 0 for the server's TIME
-- ARGV[5]     the largest clock skew allowed between regions (µs)
-- ARGV[6]     this Redis's run id and replication id (`INFO server`,
--             `INFO replication`), kept in the meta as `run`: another one
--             means this Redis restarted, was promoted or resynced from
--             another node, perhaps to data older than what its peers were
--             sent (the same
--             epoch and sequence numbers would then stand for other,
--             lower counts), so the outbox starts a new epoch and every
--             peer gets everything again, counted afresh (twice what the
--             snapshot held, until its windows end: towards denying)
--
-- Returns the outbox's epoch, the sequence number read after, the last one
-- read, 1 when this read reached the end (fewer entries than asked), this
-- Redis's clock, the generation the cursor was delivered into (empty when
-- read from 0), then pairs of member (`<start>:<window>:<hash>`) and count.
-- Entries whose window no longer matters (decide.lua drops them in turn)
-- are passed over. An entry raised while a round reads moves after the
-- last one read, so a round that reads until the end delivers every entry
-- as it stood at its last read.

-- idiv, fmt: redis/lua/numbers.lua; parse_field, extend_ttl: fields.lua;
-- both come first.

local now = tonumber(ARGV[4])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local max_skew = tonumber(ARGV[5])
local meta = redis.call('HMGET', KEYS[3], 'epoch', 'seq', 'cursor:' .. ARGV[1], 'born:' .. ARGV[1], 'run')
-- Only an outbox that exists (decide.lua writes it, with its TTL) keeps
-- the run id. One without it (new, or kept in a snapshot taken before a
-- round recorded it) may be from another run too: a new epoch as well
-- (for a new outbox, one that no peer has seen yet).
if meta[1] and meta[5] ~= ARGV[6] then
  local t = redis.call('TIME')
  local fresh = fmt(tonumber(t[1]) * 1000000 + tonumber(t[2]))
  if fresh == meta[1] then
    fresh = fmt(tonumber(fresh) + 1)
  end
  local fields = redis.call('HKEYS', KEYS[3])
  for f = 1, #fields do
    if string.sub(fields[f], 1, 7) == 'cursor:' or string.sub(fields[f], 1, 5) == 'born:' then
      redis.call('HDEL', KEYS[3], fields[f])
    end
  end
  meta[1], meta[3], meta[4] = fresh, false, false
  redis.call('HSET', KEYS[3], 'epoch', meta[1], 'run', ARGV[6])
end
local epoch = meta[1] or '0'
local seq = tonumber(meta[2] or '0') or 0
local after = tonumber(ARGV[2])
local born = ''
if after < 0 then
  after = tonumber(meta[3] or '0') or 0
  born = meta[4] or ''
  if after > seq or born == '' then
    after = 0
    born = ''
  end
end
local limit = tonumber(ARGV[3])
local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. fmt(after), '+inf', 'WITHSCORES', 'LIMIT', 0, limit)
local reply = {epoch, fmt(after), fmt(after), 0, fmt(now), born}
local count = #rows / 2
if count < limit then
  reply[4] = 1
end
if count == 0 then
  return reply
end
reply[3] = rows[#rows]
local members = {}
for r = 1, #rows, 2 do
  members[#members + 1] = rows[r]
end
local values = redis.call('HMGET', KEYS[2], unpack(members))
for m = 1, #members do
  local start, w = string.match(members[m], '^(%d+):(%d+):')
  if start ~= nil and tonumber(start) + 2 * tonumber(w) + max_skew > now and values[m] then
    reply[#reply + 1] = members[m]
    reply[#reply + 1] = values[m]
  end
end
return reply
