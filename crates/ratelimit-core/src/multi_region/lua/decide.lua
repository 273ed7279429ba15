-- One decision of a multi-region store, in its own region's Redis.
--
-- A key's state is one hash, `<prefix>:<policy>:{<key>}:mr` (see
-- fields.lua for its fields): this region's own counts, incremented here,
-- and the counts heard from each peer, by the window of this Redis's clock
-- in which they arrived (merge.lua). Every admission is also written to the
-- outbox, which the sync tasks of every instance of this region push to
-- the peers (outbox.lua), so a count reaches them even when the reply to
-- this call is lost.
--
-- KEYS[1..4]   the outbox: by sequence (ZSET), by end (ZSET), values (HASH),
--              meta (HASH: epoch, seq, run, cursor:<peer>, born:<peer>)
-- KEYS[5..4+P] `<prefix>:mr:heard:<peer>` of each peer (mark.lua)
-- then         the state hash of each check
-- ARGV[1]      the fixed time in µs (tests), or 0 for the server's TIME
-- ARGV[2]      this region's name
-- ARGV[3]      the number of regions
-- ARGV[4]      the staleness (µs of the server's TIME)
-- ARGV[5]      the largest clock skew allowed between regions (µs)
-- ARGV[6]      P, the number of peers, then their P names (as KEYS[5..])
-- then for each check: kind (1 fixed window, 2 sliding window counter),
-- limit, window (µs), cost.
--
-- A peer is counted conservatively (its current count raised to its share,
-- ceil(limit / regions)) when this Redis has not heard from it, all its
-- counts landed, within the staleness, or when its clock is known to be off
-- by more than the skew allowed, or while counts it pushed that were over
-- by this clock (mark.lua's `late`) would still count. The fields are read
-- as counts.rs `view` reads them: under another window length (a reload),
-- a field counts in the window of this length that holds its last
-- microsecond. When every check
-- passes, each is consumed (own field incremented, the hash's TTL extended,
-- the count written to the outbox); otherwise nothing is. The reply: the
-- time, then for each check whether it passes, the window start and the
-- global previous and current counts (before this call).

-- idiv, fmt: redis/lua/numbers.lua; parse_field, extend_ttl, ttl_ms: fields.lua;
-- both come first.

local t = redis.call('TIME')
local real_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = tonumber(ARGV[1])
local fixed = now > 0
if not fixed then
  now = real_now
end
local own = ARGV[2]
local regions = tonumber(ARGV[3])
local staleness = tonumber(ARGV[4])
local max_skew = tonumber(ARGV[5])
local peer_count = tonumber(ARGV[6])
local outbox_seq, outbox_end, outbox_val, outbox_meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

-- The peers counted conservatively.
local conservative = {}
for i = 1, peer_count do
  local name = ARGV[6 + i]
  local heard = redis.call('HMGET', KEYS[4 + i], 'at', 'skewed', 'late')
  local at = tonumber(heard[1])
  local late = tonumber(heard[3] or '0') or 0
  if at == nil or real_now - at > staleness or heard[2] == '1' or late > now then
    conservative[name] = true
  end
end
local base = 7 + peer_count
local first_hash = 5 + peer_count

-- The view of one hash under a window of `w` at `now`: window start,
-- previous and current global counts, and the fields to drop.
local function view(hash, w, share)
  local aligned = idiv(now, w) * w
  local fields = redis.call('HGETALL', hash)
  local counts = {}
  local expired = {}
  for f = 1, #fields, 2 do
    local kind, region, s, w0 = parse_field(fields[f], w)
    if kind == 'count' and s + 2 * w0 <= now then
      -- A count lasts until the window after its own ends, under any
      -- window length (as a single-region state lasts as long as the
      -- decision that wrote it said).
      expired[#expired + 1] = fields[f]
    elseif kind == 'count' then
      local value = tonumber(fields[f + 1]) or 0
      counts[fields[f]] = {region, s, w0, value, idiv(s + w0 - 1, w) * w}
    elseif kind == 'seen' and s + 2 * w0 + max_skew <= now then
      expired[#expired + 1] = fields[f]
    end
  end
  local start = aligned
  local current_of = {}
  local previous = 0
  for _, c in pairs(counts) do
    local region, s, w0, value, mapped = c[1], c[2], c[3], c[4], c[5]
    if mapped >= aligned then
      current_of[region] = (current_of[region] or 0) + value
      if mapped > start then
        start = mapped
      end
    else
      local next_field = counts[region .. ':' .. fmt(s + w0) .. ':' .. fmt(w0)]
      if mapped == aligned - w or (next_field ~= nil and next_field[5] >= aligned) then
        previous = previous + value
      end
    end
  end
  local current = current_of[own] or 0
  for region, value in pairs(current_of) do
    if region ~= own then
      if conservative[region] and value < share then
        value = share
      end
      current = current + value
    end
  end
  for region in pairs(conservative) do
    if current_of[region] == nil then
      current = current + share
    end
  end
  return start, previous, current, expired
end

local checks = {}
local all_pass = true
for i = first_hash, #KEYS do
  local at = base + (i - first_hash) * 4
  local kind, limit = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  local w, cost = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  local share = idiv(limit + regions - 1, regions)
  local start, previous, current, expired = view(KEYS[i], w, share)
  local pass
  if kind == 1 then
    pass = current + cost <= limit
  else
    local p, c = math.min(previous, 2 * limit), math.min(current, 2 * limit)
    local elapsed = now - start
    if elapsed < 0 then
      elapsed = 0
    end
    pass = p * (w - elapsed) + (c + cost) * w <= limit * w
  end
  if not pass then
    all_pass = false
  end
  checks[#checks + 1] = {pass, start, previous, current, cost, w, expired, KEYS[i]}
end

local reply = {fmt(now)}
local outbox_until = 0
local written = false
for _, c in ipairs(checks) do
  local hash, start, w, cost = c[8], c[2], c[6], c[5]
  if all_pass and cost > 0 then
    if not written then
      written = true
      -- A new outbox (or one lost with this Redis's data) starts a new
      -- epoch, so peers count its counts afresh, after the highest
      -- sequence still held.
      if redis.call('HSETNX', outbox_meta, 'epoch', fmt(real_now)) == 1 then
        local top = redis.call('ZREVRANGE', outbox_seq, 0, 0, 'WITHSCORES')
        if top[2] ~= nil then
          redis.call('HSET', outbox_meta, 'seq', top[2])
        end
      end
    end
    -- One sequence number per entry: a round reads after the last one it
    -- read, so no two entries may share one.
    local seq = redis.call('HINCRBY', outbox_meta, 'seq', 1)
    local value = redis.call('HINCRBY', hash, own .. ':' .. fmt(start) .. ':' .. fmt(w), fmt(cost))
    if #c[7] > 0 then
      redis.call('HDEL', hash, unpack(c[7]))
    end
    extend_ttl(hash, ttl_ms(start + 2 * w, now, fixed))
    local member = fmt(start) .. ':' .. fmt(w) .. ':' .. hash
    local ends = start + 2 * w + max_skew
    redis.call('ZADD', outbox_seq, fmt(seq), member)
    redis.call('ZADD', outbox_end, fmt(ends), member)
    redis.call('HSET', outbox_val, member, fmt(value))
    if ends > outbox_until then
      outbox_until = ends
    end
  end
  local pass = 0
  if c[1] then
    pass = 1
  end
  reply[#reply + 1] = pass
  reply[#reply + 1] = fmt(start)
  reply[#reply + 1] = fmt(c[3])
  reply[#reply + 1] = fmt(c[4])
end

if written then
  -- Entries whose window no longer matters leave the outbox, a few per
  -- call (as many as this call added, and two more).
  local gone = redis.call('ZRANGEBYSCORE', outbox_end, '-inf', fmt(now), 'LIMIT', 0, #checks + 2)
  if #gone > 0 then
    redis.call('ZREM', outbox_seq, unpack(gone))
    redis.call('ZREM', outbox_end, unpack(gone))
    redis.call('HDEL', outbox_val, unpack(gone))
  end
  for k = 1, 4 do
    extend_ttl(KEYS[k], ttl_ms(outbox_until, now, fixed))
  end
end
return reply
