-- Blocks a key (AdminStore::block). KEYS[1]: the block key, `<state key>:block`,
-- in the state key's hash slot. ARGV: fixed time (0 = server TIME), the
-- block's duration in µs (at least 1).
-- The block key holds the time (µs) the block ends, and expires then; every
-- check script reads it (see decide_unless_blocked in the prelude).
local now = server_now()
local duration = tonumber(ARGV[2])
redis.call('SET', KEYS[1], fmt(now + duration), 'PX', ttl_ms(duration))
return 1
