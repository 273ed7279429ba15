-- One decision. keys[1]: the state key, keys[2]: its block key. args: cost,
-- the two policy parameters, then, only when needed, a fixed time (absent or
-- 0: server TIME) and a permit id (concurrency only): KEYS and ARGV of a
-- script, or the keys and arguments of FCALL (library.lua). Every argument
-- costs Redis about 1,000 instructions (callgrind), so the common call sends
-- three.
-- Reply: {allowed, remaining, reset_after, wait} in µs, `wait` being the
-- retry of a denial or the delay of an admission (the limit is the first
-- policy parameter, which the caller knows), as one check of batch.lua.
-- The reply, one table filled on every call: Redis turns it into its answer
-- as soon as the call returns, and a library's table outlives the call, so
-- no call allocates one (the Lua collector's work grows with what calls
-- allocate).
local SINGLE_REPLY = {}

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
  -- The block key (block_left, inline: a missing key, the common case,
  -- costs no further Lua call).
  local held = redis.pcall('GET', keys[2])
  local left = 0
  if held then
    left = block_left_of_get(held, now)
  end
  local r
  if left == 0 then
    r = decide(key, now, cost, p1, p2, args[5])
  else
    r = decide_with_block(decide, key, left, now, cost, p1, p2, args[5])
  end
  if r[1] == 1 then
    commit(r)
    SINGLE_REPLY[1], SINGLE_REPLY[2], SINGLE_REPLY[3], SINGLE_REPLY[4] = 1, r[3], r[4], r[6]
  else
    SINGLE_REPLY[1], SINGLE_REPLY[2], SINGLE_REPLY[3], SINGLE_REPLY[4] = 0, r[3], r[4], r[5]
  end
  return SINGLE_REPLY
end
