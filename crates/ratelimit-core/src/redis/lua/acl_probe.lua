-- Whether the Redis user may run every write command the scripts use, on a
-- key under the store's prefix, and whether the node takes writes at all.
-- Run once per connection, when the store connects or reconnects (a
-- restart, a failover), not inside every decision: a Redis script is not
-- rolled back when a command inside it is denied, so a user allowed to
-- write a key but not to set its TTL must be refused before any script
-- writes. KEYS[1]: a key under the prefix, never written.
-- Reply: 1, or `NOPERM the rate limiter needs <command> on <key>`, or
-- `RATELIMIT_REPLICA ...` on a read-only replica.
local key = KEYS[1]
if redis.acl_check_cmd then
  local writes = {{'set', key, '1'}, {'pexpire', key, '1'}}
  for _, command in ipairs(writes) do
    if not redis.acl_check_cmd(unpack(command)) then
      return redis.error_reply('NOPERM the rate limiter needs ' .. command[1] .. ' on ' .. key)
    end
  end
end
-- A write that changes nothing (the key does not exist): a replica refuses
-- it, as it would refuse every decision.
local tried = redis.pcall('pexpire', key, 1)
if type(tried) == 'table' and tried.err then
  if string.find(tried.err, '^READONLY') then
    return redis.error_reply('RATELIMIT_REPLICA the node is a read-only replica: '
      .. 'give the store its master\'s URL')
  elseif string.find(tried.err, '^NOPERM') then
    return redis.error_reply('NOPERM the rate limiter needs pexpire on ' .. key)
  end
end
return 1
