-- Admin blocks (block.lua writes them in front of the state, see the
-- prelude): every check honours its key's.

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

-- The reply `r` of `decide` for one check of `key` when the read it made
-- found a block still running at `now` (BLOCK_END, see the prelude): a
-- denial that writes nothing. The caller checks BLOCK_END > now first, so a
-- key without a block costs no further call.
local function blocked(decide, r, key, now, cost, p1, p2, permit)
  local left = BLOCK_END - now
  local peek = r
  if r[1] == 1 and cost > 0 then
    peek = decide(key, now, 0, p1, p2, permit)
  end
  return blocked_reply(r, peek, left)
end

-- One check of `key` by `decide`: the algorithm's reply (to commit when it
-- allows), or, while the key is blocked, a denial that writes nothing.
local function decide_unless_blocked(decide, key, now, cost, p1, p2, permit)
  local r = decide(key, now, cost, p1, p2, permit)
  if BLOCK_END > now then
    return blocked(decide, r, key, now, cost, p1, p2, permit)
  end
  return r
end
