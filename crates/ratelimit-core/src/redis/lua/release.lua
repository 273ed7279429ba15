-- Releases a concurrency permit. KEYS[1]: the state key. ARGV: fixed time
-- (0 = server TIME), permit id. Reply: 1 if the permit was still held.
local now = server_now()
local key, prefix = KEYS[1], ARGV[2] .. ':'
-- Another algorithm's state under the policy's name holds no permit of ours
-- (MemoryStore ignores it too): nothing to release, nothing to touch.
if not holds_members(key, 'permits') then
  return 0
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
local found = 0
for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do
  if string.sub(member, 1, #prefix) == prefix then
    redis.call('ZREM', key, member)
    found = 1
  end
end
local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if newest[2] then
  expire_or_delete(key, positive(tonumber(newest[2]) - now))
end
return found
