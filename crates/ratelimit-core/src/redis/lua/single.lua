-- One decision. keys[1]: the state key (an admin block in it, see the
-- prelude). args: cost,
-- the two policy parameters, then, only when needed, a fixed time (absent or
-- 0: server TIME) and a permit id (concurrency only): KEYS and ARGV of a
-- script, or the keys and arguments of FCALL (library.lua). Every argument
-- costs Redis work, so the common call sends three.
-- Reply: four integers, {allowed (1 or 0), remaining, reset_after, wait},
-- times in µs, `wait` being the retry of a denial or the delay of an
-- admission (the limit is the first policy parameter, which the caller
-- knows); or, when `as_text`, the same four as one line of text, in
-- decimal, separated by single spaces ("1 9 1000000 0"): one value for the
-- client to read where an array is five, still readable in redis-cli and
-- MONITOR.
local function run_single(decide, keys, args, as_text)
  local fixed = args[4]
  local call = new_call(fixed and tonumber(fixed) or 0, true)
  local now = server_now(call)
  local key, cost, p1, p2 = keys[1], number(args[1]), number(args[2]), number(args[3])
  local ok, limit, remaining, reset, retry, delay, wkey, wtag, wvalue, wreset = decide(call, key, now, cost, p1, p2, args[5])
  -- A block in the state key (decide_unless_blocked, inline: a key without
  -- one, the common case, costs no further Lua call).
  if call.block_end > now then
    ok, limit, remaining, reset, retry = blocked(call, decide, key, now, cost, p1, p2, args[5], ok, limit, reset, retry)
  end
  if ok == 1 then
    if wkey then
      write_state(call, wkey, wtag, wvalue, wreset)
    end
    if as_text then
      return string.format('1 %d %d %d', remaining, reset, delay)
    end
    return {1, remaining, reset, delay}
  end
  if as_text then
    return string.format('0 %d %d %d', remaining, reset, retry)
  end
  return {0, remaining, reset, retry}
end
