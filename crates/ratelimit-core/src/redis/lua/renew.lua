-- Renews the lease of a concurrency permit. KEYS[1]: the state key. ARGV:
-- fixed time (0 = server TIME), permit id, lease (µs). Reply: 1 if the
-- permit was still held (its lease now ends a lease from now), 0 if it was
-- released or expired (then nothing comes back).
local call = new_call(tonumber(ARGV[1]) or 0, false)
return sem_renew(call, KEYS[1], server_now(call), ARGV[2], tonumber(ARGV[3]))
