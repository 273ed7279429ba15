-- One decision. keys[1]: the state key (an admin block in it, see the
-- prelude). args: cost,
-- the two policy parameters, then, only when needed, a fixed time (absent or
-- 0: server TIME) and a permit id (concurrency only): KEYS and ARGV of a
-- script, or the keys and arguments of FCALL (library.lua). Every argument
-- costs Redis about 1,000 instructions (callgrind), so the common call sends
-- three.
-- Reply: one record of batch.lua's reply (struct.pack '<Bddd': allowed, one
-- byte, then remaining, reset_after and wait, little-endian doubles), `wait`
-- being the retry of a denial or the delay of an admission (the limit is
-- the first policy parameter, which the caller knows). One string costs
-- Redis less than an array of four integers (67,100 against 71,300
-- instructions per GCRA call, callgrind), and the client reads one value
-- instead of five (12,700 against 16,900 client instructions per decision
-- at 64 in flight without coalescing): see BATCH_RECORD in replies.rs.
local function run_single(decide, keys, args)
  local fixed = args[4]
  if fixed then
    FIXED_NOW = tonumber(fixed) or 0
  else
    FIXED_NOW = 0
  end
  ONE_STATE_KEY = true
  local now = server_now()
  local key, cost, p1, p2 = keys[1], number(args[1]), number(args[2]), number(args[3])
  local ok, limit, remaining, reset, retry, delay, wkey, wtag, wvalue, wreset = decide(key, now, cost, p1, p2, args[5])
  -- A block in the state key (decide_unless_blocked, inline: a key without
  -- one, the common case, costs no further Lua call).
  if BLOCK_END > now then
    ok, limit, remaining, reset, retry = blocked(decide, key, now, cost, p1, p2, args[5], ok, limit, reset, retry)
  end
  if ok == 1 then
    if wkey then
      write_state(wkey, wtag, wvalue, wreset)
    end
    return struct.pack('<Bddd', 1, remaining, reset, delay)
  end
  return struct.pack('<Bddd', 0, remaining, reset, retry)
end
