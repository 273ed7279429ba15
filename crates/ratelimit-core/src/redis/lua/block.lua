-- Blocks a key, or lifts its block (AdminStore::block and ::unblock).
-- KEYS[1]: the state key. ARGV: fixed time (0 = server TIME), the block's
-- duration in µs (0: unblock), the policy's algorithm and its two
-- parameters, and the longest (µs) a state of the policy matters.
-- The block goes in front of the state, "b<end>;<state>" (see the prelude),
-- `end` the time (µs) it ends: the state is kept as it is. The key lives
-- until the later of the block's end and the state's own, which a peek at
-- the state tells (its reset: when the budget is full again) rather than
-- the key's TTL, which an earlier block may have lengthened: so an unblock,
-- or a shorter block in place of a longer one, leaves the key no longer
-- than its state matters, and a state back to fresh goes. A state the
-- policy cannot read (another algorithm's under its name, a conflict every
-- check reports) keeps the TTL the key has, at most the policy's longest.
-- A new block replaces the one before.
-- A key that holds no string (a sorted set of an earlier layout) is
-- replaced by the block alone.
-- Reply: 1.
local call = new_call(tonumber(ARGV[1]) or 0, false)
local now = server_now(call)
local key, duration = KEYS[1], tonumber(ARGV[2])
local algorithm, p1, p2 = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local longest = tonumber(ARGV[6])
local raw = redis.pcall('GET', key)
if type(raw) ~= 'string' then
  raw = nil
end
if duration == 0 and not (raw and string.byte(raw) == BLOCK_BYTE) then
  return 1
end
local lifetime
if raw then
  -- The peek writes nothing but the drop of expired entries (rewrite keeps
  -- the block in front): the state is read again after it.
  local read, _, _, _, reset = pcall(ALGORITHMS[algorithm], call, key, now, 0, p1, p2, '')
  if read then
    lifetime = reset
  end
  raw = redis.call('GET', key)
end
local state = raw and unblocked(call, raw)
if state and not lifetime then
  local ttl = redis.call('PTTL', key)
  lifetime = longest
  if ttl >= 0 and ttl * 1000 < longest then
    lifetime = ttl * 1000
  end
end
if not state or lifetime <= 0 then
  state = nil
  lifetime = 0
end
if duration == 0 then
  if state then
    redis.call('SET', key, state, 'PX', ttl_ms(call, lifetime))
  else
    redis.call('DEL', key)
  end
  return 1
end
if lifetime < duration then
  lifetime = duration
end
redis.call('SET', key, 'b' .. fmt(now + duration) .. ';' .. (state or ''), 'PX', ttl_ms(call, lifetime))
return 1
