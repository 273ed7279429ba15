-- Gives back what a multi-limit script consumed, for limits on Redis Cluster
-- whose keys live in different slots (one script per slot, in slot order; when
-- a later slot denies, the earlier ones are refunded).
--
-- KEYS[i]: the state key of check i, then, last, the ids of the operations
-- applied to the first (see applied_ids in the prelude). ARGV[1]: fixed
-- time (0 = server TIME); ARGV[2]: the refund's id (32 hex digits, the same
-- when the store sends it again: a refund applied already changes nothing);
-- then five values per check: algorithm, cost, permit id, the state the
-- consuming script left ("after") and the state it found ("before").
--
-- A refund never gives back more than was taken:
--   * a string state (fixed window, sliding counter, token bucket, GCRA,
--     leaky bucket) is restored only if nobody changed it since; otherwise
--     the consumption stays (the request is refused anyway, and the key
--     errs towards denying);
--   * a sliding log loses exactly the units this request added;
--   * a concurrency permit is released (as release.lua releases it).
-- A key that meanwhile holds another type of state (WRONGTYPE: a policy that
-- changed algorithm) is left alone, and the other keys are still refunded.

local function restore_string(key, after, before)
  if after == '' then
    return
  end
  local current = redis.pcall('GET', key)
  if wrong_type(current) or current ~= after then
    return
  end
  if before == '' then
    redis.call('DEL', key)
  else
    redis.call('SET', key, before, 'KEEPTTL')
  end
end

local call = new_call(tonumber(ARGV[1]) or 0, false)
local now = server_now(call)
local n = #KEYS - 1
local applied = KEYS[n + 1]
local ids, done = applied_ids(applied, ARGV[2])
if done then
  return n
end
-- The longest any state lived, before or after: as long as the id is kept.
local lived = -2
for i = 1, n do
  local a = 3 + (i - 1) * 5
  local algorithm, cost, permit = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2]
  local after, before = ARGV[a + 3], ARGV[a + 4]
  local key = KEYS[i]
  lived = math.max(lived, redis.call('PTTL', key))
  if algorithm == 'concurrency' then
    sem_release(call, key, now, permit)
  elseif algorithm == 'sliding-log' and after ~= '' then
    -- `after` holds the time of the entry this request added to.
    log_refund(call, key, tonumber(after), cost, now)
  elseif algorithm ~= 'sliding-log' then
    restore_string(key, after, before)
  end
  lived = math.max(lived, redis.call('PTTL', key))
end
remember_applied(applied, ids, ARGV[2], lived)
return n
