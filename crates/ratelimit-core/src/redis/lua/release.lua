-- Releases a concurrency permit. KEYS[1]: the state key. ARGV: fixed time
-- (0 = server TIME), permit id. Reply: 1 if the permit was still held.
return sem_release(KEYS[1], server_now(), ARGV[2])
