-- Gives back what a multi-limit script consumed, for limits on Redis Cluster
-- whose keys live in different slots (one script per slot, in slot order; when
-- a later slot denies, the earlier ones are refunded).
--
-- KEYS[i]: the state key of check i. ARGV[1]: fixed time (0 = server TIME);
-- then four values per check: algorithm, cost, permit id, and the state the
-- consuming script left ("after"), followed by the state it found ("before")
-- as ARGV[...] pairs, see below.
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

local now = server_now()
for i = 1, #KEYS do
  local a = 2 + (i - 1) * 5
  local algorithm, cost, permit = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2]
  local after, before = ARGV[a + 3], ARGV[a + 4]
  local key = KEYS[i]
  if algorithm == 'concurrency' then
    sem_release(key, now, permit)
  elseif algorithm == 'sliding-log' and after ~= '' then
    -- `after` holds the time of the entry this request added to.
    log_refund(key, tonumber(after), cost, now)
  elseif algorithm ~= 'sliding-log' then
    restore_string(key, after, before)
  end
end
return #KEYS
