-- The plain one-key token bucket the Redis targets are measured against (the
-- simplest script that limits correctly): TIME, HMGET, HSET, PEXPIRE. KEYS[1]: the key; ARGV: capacity, tokens per second, cost.
local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local b = redis.call('HMGET', key, 't', 'ts')
local tokens = tonumber(b[1]) or capacity
local ts = tonumber(b[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate / 1000)
local ok = 0
if tokens >= cost then tokens = tokens - cost; ok = 1 end
redis.call('HSET', key, 't', tokens, 'ts', now)
redis.call('PEXPIRE', key, math.ceil(capacity / rate * 1000))
return {ok, math.floor(tokens)}
