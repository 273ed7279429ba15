-- Admin blocks (block.lua writes them in front of the state, see the
-- prelude): every check honours its key's.

-- The reply of a check of a blocked key, `left` µs before the block ends:
-- denied, nothing remaining, full again when both the block and the state
-- allow (`peek_reset`: the reset of the algorithm's reply at cost 0),
-- retried when both the block and the algorithm allow the request (`ok`,
-- `retry`: the algorithm's reply, never committed).
local function blocked_reply(left, ok, limit, retry, peek_reset)
  if ok == 1 or retry < left then
    retry = left
  end
  if left > peek_reset then
    peek_reset = left
  end
  return 0, limit, 0, peek_reset, retry, 0
end

-- The reply to one check of `key` by `decide` when the read it made found a
-- block still running at `now` (call.block_end, see the prelude), from the
-- algorithm's own reply (`ok`, `limit`, `reset`, `retry`): a denial that
-- writes nothing. The caller checks call.block_end > now first, so a key
-- without a block costs no further call.
local function blocked(call, decide, key, now, cost, p1, p2, permit, ok, limit, reset, retry)
  local left = call.block_end - now
  if ok == 1 and cost > 0 then
    local _
    _, _, _, reset = decide(call, key, now, 0, p1, p2, permit)
  end
  return blocked_reply(left, ok, limit, retry, reset)
end

-- One check of `key` by `decide`: the algorithm's reply (its write to
-- commit when it allows, see state.lua), or, while the key is blocked, a
-- denial that writes nothing.
local function decide_unless_blocked(call, decide, key, now, cost, p1, p2, permit)
  local ok, limit, remaining, reset, retry, delay, wkey, wtag, wvalue, wreset = decide(call, key, now, cost, p1, p2, permit)
  if call.block_end > now then
    return blocked(call, decide, key, now, cost, p1, p2, permit, ok, limit, reset, retry)
  end
  return ok, limit, remaining, reset, retry, delay, wkey, wtag, wvalue, wreset
end
