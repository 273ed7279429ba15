-- Moves one peer's cursor in this region's outbox: what was delivered to
-- the peer, and the generation of the peer's Redis it was delivered into
-- (mark.lua's `born`). Forward after a round delivered everything up to a
-- sequence number; back to 0 when the peer's Redis no longer holds what the
-- cursor says (unless another round moved the cursor meanwhile). A round
-- that read another epoch of the outbox (lost and started again meanwhile)
-- moves nothing.
--
-- KEYS[1]  the outbox's meta (HASH: epoch, seq, run, cursor:<peer>,
--          born:<peer>)
-- ARGV[1]  the peer's name
-- ARGV[2]  the sequence number, or -1 to go back to 0
-- ARGV[3]  the epoch the round read
-- ARGV[4]  the generation: marked (forward) or relied on (back)
-- Returns 1 when moved.

local cursor, generation = 'cursor:' .. ARGV[1], 'born:' .. ARGV[1]
local meta = redis.call('HMGET', KEYS[1], 'epoch', cursor, generation)
if meta[1] ~= ARGV[3] then
  return 0
end
local born = meta[3] or ''
if ARGV[2] == '-1' then
  if born == ARGV[4] then
    redis.call('HDEL', KEYS[1], cursor, generation)
    return 1
  end
  return 0
end
local to = tonumber(ARGV[2])
local at = tonumber(meta[2] or '0') or 0
if born ~= ARGV[4] or to > at then
  redis.call('HSET', KEYS[1], cursor, ARGV[2], generation, ARGV[4])
  return 1
end
return 0
