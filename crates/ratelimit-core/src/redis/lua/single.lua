-- One decision. keys[1]: the state key, keys[2]: its block key. args: fixed
-- time (0 = server TIME), cost, two policy parameters, permit id
-- (concurrency only): KEYS and ARGV of a script, or the keys and arguments of
-- FCALL (library.lua).
-- Reply: {allowed, limit, remaining, reset_after, retry_after, delay} in µs.
local function run_single(decide, keys, args)
  FIXED_NOW = tonumber(args[1]) or 0
  ONE_STATE_KEY = true
  local now = server_now()
  local r = decide_with_block(decide, keys[1], block_left(keys[2], now), now, tonumber(args[2]), tonumber(args[3]), tonumber(args[4]), args[5])
  if r[1] == 1 then
    commit(r)
  end
  -- Redis replies with the array part only (commit and other fields aside).
  return r
end
