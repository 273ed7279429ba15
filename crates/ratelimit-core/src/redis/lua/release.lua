-- Releases a concurrency permit. KEYS[1]: the state key. ARGV: fixed time
-- (0 = server TIME), permit id. Reply: 1 if the permit was still held.
local call = new_call(tonumber(ARGV[1]) or 0, false)
return sem_release(call, KEYS[1], server_now(call), ARGV[2])
