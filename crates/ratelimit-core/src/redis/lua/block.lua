-- Blocks a key, or lifts its block (AdminStore::block and ::unblock).
-- KEYS[1]: the state key. ARGV: fixed time (0 = server TIME), the block's
-- duration in µs (0: unblock).
-- The block goes in front of the state, "b<end>;<state>" (see the prelude),
-- `end` the time (µs) it ends: the state is kept as it is, and the key lives
-- until the block ends or the state's own TTL, whichever comes later. A new
-- block replaces the one before. Unblocking leaves the state and its TTL.
-- A key that holds no string (a sorted set of the layout before issue 13)
-- is replaced by the block alone.
-- Reply: 1.
local now = server_now()
local duration = tonumber(ARGV[2])
local key = KEYS[1]
local raw = redis.pcall('GET', key)
local state, ttl, had_block = nil, 0, false
if type(raw) == 'string' then
  had_block = string.byte(raw) == BLOCK_BYTE
  state = unblocked(raw)
  if state then
    ttl = redis.call('PTTL', key)
  end
end
if duration == 0 then
  if had_block then
    if state then
      redis.call('SET', key, state, 'KEEPTTL')
    else
      redis.call('DEL', key)
    end
  end
  return 1
end
local px = tonumber(ttl_ms(duration))
if ttl > px then
  px = ttl
end
redis.call('SET', key, 'b' .. fmt(now + duration) .. ';' .. (state or ''), 'PX', px)
return 1
