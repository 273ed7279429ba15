-- Admin blocks (block.lua writes them): every check honours its key's.
-- A block key only ever holds the string block.lua writes (its SET replaces
-- whatever the key held), so a key of another type is no block: read as
-- none, here as by the batch's MGET (batch.lua), which answers nil for it.

-- How long a block key holding `raw` (its GET or MGET reply: false when
-- missing or not a string) still blocks, in µs (0: not blocked).
local function block_left_of(raw, now)
  if not raw then
    return 0
  end
  return positive(tonumber(raw) - now)
end

-- The same from the reply of redis.pcall('GET', <block key>): a key of
-- another type (WRONGTYPE) is no block.
local function block_left_of_get(raw, now)
  if type(raw) == 'table' and wrong_type(raw) then
    return 0
  end
  return block_left_of(raw, now)
end

-- How long `block_key` still blocks its state key, in µs (0: not blocked).
local function block_left(block_key, now)
  if not block_key then
    return 0
  end
  return block_left_of_get(redis.pcall('GET', block_key), now)
end

-- The reply for a blocked key, `left` µs before the block ends: denied,
-- nothing remaining, full again when both the block and the state allow
-- (`peek`: the algorithm's reply at cost 0), retried when both the block and
-- the algorithm allow the request (`r`: its reply, never committed).
local function blocked_reply(r, peek, left)
  local retry = left
  if r[1] ~= 1 and r[5] > retry then
    retry = r[5]
  end
  local reset = peek[4]
  if left > reset then
    reset = left
  end
  return {0, r[2], 0, reset, retry, 0}
end

-- One check of `key` by `decide`, its key blocked `left` more µs: the
-- algorithm's reply (and its commit) when not blocked, a denial without
-- commit when blocked.
local function decide_with_block(decide, key, left, now, cost, p1, p2, permit)
  local r = decide(key, now, cost, p1, p2, permit)
  if left == 0 then
    return r
  end
  local peek = r
  if r[1] == 1 and cost > 0 then
    peek = decide(key, now, 0, p1, p2, permit)
  end
  return blocked_reply(r, peek, left)
end

-- The same, reading the block from `block_key`.
local function decide_unless_blocked(decide, key, block_key, now, cost, p1, p2, permit)
  return decide_with_block(decide, key, block_left(block_key, now), now, cost, p1, p2, permit)
end
