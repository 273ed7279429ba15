-- Several limits for one request, all or nothing. With n checks, KEYS[i]: the
-- state key of check i (an admin block is in it, see the prelude). ARGV[1]: fixed time (0 =
-- server TIME); then five values per check: algorithm, cost, two policy
-- parameters, permit id.
-- Every decision is made first; only if all allow are their writes applied.
-- Otherwise (a limit denies, or a key is blocked) nothing is written, and the
-- checks that would have allowed report a peek (cost 0) of their current
-- state.
--
-- Each reply entry is {allowed, limit, remaining, reset, retry, delay, after,
-- before}: for a write, the state key's value after and before it (strings
-- for string states, the entry time for a sliding log), so that a refund
-- (Redis Cluster, limits in several slots) can undo exactly this write.
local call = new_call(tonumber(ARGV[1]) or 0, false)
local now = server_now(call)
local n = #KEYS
local results, all = {}, true
for i = 1, n do
  local a = 1 + (i - 1) * 5
  local decide = ALGORITHMS[ARGV[a + 1]]
  local r = {decide_unless_blocked(call, decide, KEYS[i], now, tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), ARGV[a + 5])}
  results[i] = r
  if r[1] ~= 1 then
    all = false
  end
end
local out = {}
for i = 1, n do
  local r = results[i]
  local after, before = '', ''
  if all then
    if writes(r) then
      local algorithm = ARGV[1 + (i - 1) * 5 + 1]
      if algorithm == 'sliding-log' then
        -- The time of the entry that holds this request's units (the log's
        -- newest once written), before commit clears the value.
        after = fmt(log_newest(r[9]))
      elseif algorithm ~= 'concurrency' then
        before = redis.call('GET', KEYS[i]) or ''
      end
      commit(call, r)
      if algorithm ~= 'sliding-log' and algorithm ~= 'concurrency' then
        after = redis.call('GET', KEYS[i]) or ''
      end
    end
  elseif r[1] == 1 then
    local a = 1 + (i - 1) * 5
    r = {ALGORITHMS[ARGV[a + 1]](call, KEYS[i], now, 0, tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), ARGV[a + 5])}
  end
  out[i] = {r[1], r[2], r[3], r[4], r[5], r[6], after, before}
end
return out
