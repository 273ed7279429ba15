-- Several independent requests in one call: the store's coalescing (see
-- coalesce.rs) gathers the requests that arrive while a call is in flight
-- and sends them together, as the library's batch function (FCALL) or, where
-- functions cannot be used, as a script with the same keys and arguments.
--
-- keys: the state key of every check of every request, in order, then their
-- block keys in the same order. args[1]: fixed time (0 = server TIME); then,
-- per request, its number of checks m, then five values per check:
-- algorithm, cost, two policy parameters, permit id.
--
-- The requests are decided one after the other, each with its writes applied
-- before the next reads: as if each had been its own call, in this order. A
-- request of one check is decided as single.lua decides it; a request of
-- several checks as multi.lua does (all or nothing; the checks that would
-- have allowed report a peek), without the states multi.lua reports for
-- refunds.
--
-- Reply: per request, {allowed, limit, remaining, reset, retry, delay} for
-- one check, a list of those for several; or, for a request that fails (a
-- policy conflict), its error message as a string, and the other requests
-- go on.

-- Request `m` checks: state keys keys[first..], block keys keys[blocks +
-- first..], arguments args[a..].
local function batch_request(keys, blocks, first, args, a, m, now)
  if m == 1 then
    local r = decide_unless_blocked(ALGORITHMS[args[a]], keys[first], keys[blocks + first], now, tonumber(args[a + 1]), tonumber(args[a + 2]), tonumber(args[a + 3]), args[a + 4])
    if r[1] == 1 then
      commit(r)
    end
    return {r[1], r[2], r[3], r[4], r[5], r[6]}
  end
  local results, all = {}, true
  for i = 1, m do
    local k, b = first + i - 1, a + (i - 1) * 5
    local r = decide_unless_blocked(ALGORITHMS[args[b]], keys[k], keys[blocks + k], now, tonumber(args[b + 1]), tonumber(args[b + 2]), tonumber(args[b + 3]), args[b + 4])
    results[i] = r
    if r[1] ~= 1 then
      all = false
    end
  end
  local out = {}
  for i = 1, m do
    local r = results[i]
    if all then
      commit(r)
    elseif r[1] == 1 then
      local k, b = first + i - 1, a + (i - 1) * 5
      r = ALGORITHMS[args[b]](keys[k], now, 0, tonumber(args[b + 2]), tonumber(args[b + 3]), args[b + 4])
    end
    out[i] = {r[1], r[2], r[3], r[4], r[5], r[6]}
  end
  return out
end

local function run_batch(keys, args)
  FIXED_NOW = tonumber(args[1]) or 0
  -- Several state keys: errors name theirs (see read_state).
  ONE_STATE_KEY = false
  local now = server_now()
  local blocks = idiv(#keys, 2)
  local out, first, a = {}, 1, 2
  while a <= #args do
    local m = tonumber(args[a])
    local ok, r = pcall(batch_request, keys, blocks, first, args, a + 1, m, now)
    if not ok then
      -- A conflict fails before writing anything; its request alone fails.
      -- Its error goes as a string (an error inside an array would fail the
      -- whole reply in clients).
      if type(r) == 'table' and r.err then
        r = r.err
      else
        r = tostring(r)
      end
    end
    out[#out + 1] = r
    first, a = first + m, a + 1 + m * 5
  end
  return out
end
