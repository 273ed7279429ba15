-- Several independent requests in one call: the store's coalescing (see
-- coalesce.rs) gathers the requests that arrive while a call is in flight
-- and sends them together, as the library's batch function (FCALL) or, where
-- functions cannot be used, as a script with the same keys and arguments.
--
-- keys: the state key of every check of every request, in order (an admin
-- block is in the state key, see the prelude): every key the call touches,
-- all of one hash slot on a Redis Cluster.
-- args[1]: fixed time (0 = server TIME); args[2]: the number of forms f,
-- then four values per form: algorithm, cost, two policy parameters (a form
-- is what a check asks, besides its key: a batch has few, each sent once).
-- Then per request: a form's index (1-based) for a request of one check, or
-- -m for a request of m checks followed by their m forms' indexes. A check
-- of a concurrency form is followed by its permit id.
--
-- The requests are decided one after the other, each with its writes applied
-- before the next reads: as if each had been its own call, in this order. A
-- request of one check is decided as single.lua decides it; a request of
-- several checks as multi.lua does (all or nothing; the checks that would
-- have allowed report a peek), without the states multi.lua reports for
-- refunds.
--
-- Reply: one flat array, the requests in order. A request puts four
-- integers per check, {allowed (1 or 0), remaining, reset, wait} as
-- single.lua replies (wait: the retry of a denial, the delay of an
-- admission; the limit is the form's first parameter, which the client
-- knows). A request that fails (a policy conflict) puts one string in
-- their place, its error message; the other requests go on.

-- Appends the reply of check `r` to `out` after its `n` values; returns the
-- new count.
local function put(out, n, r)
  local wait = r[5]
  if r[1] == 1 then
    wait = r[6]
  end
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = r[1], r[3], r[4], wait
  return n + 4
end

-- Decides the requests from cursor.arg (args) and cursor.key (keys) on,
-- appending their replies to `out`. Before deciding a request it notes in
-- cursor.next_arg and cursor.next_key where the next one starts, and after
-- it, in cursor.arg, cursor.key and cursor.filled, how far the batch got:
-- run_batch goes on from there after a request that fails.
local function decide_requests(call, keys, args, forms, now, out, cursor)
  local a, k, n = cursor.arg, cursor.key, cursor.filled
  local last = #args
  while a <= last do
    -- Until its extent is known, a failure ends the batch.
    cursor.next_arg = last + 1
    -- A form's index, by its text (no number to parse), or -m.
    local f = forms[args[a]]
    if f then
      -- One check: Redis's WRONGTYPE, unprotected, is its conflict.
      local permit = nil
      a = a + 1
      if f[5] then
        permit = args[a]
        a = a + 1
      end
      cursor.next_arg, cursor.next_key = a, k + 1
      call.one_key = true
      local decide = f[1]
      local ok, limit, remaining, reset, retry, delay, wkey, wtag, wvalue, wreset = decide(call, keys[k], now, f[2], f[3], f[4], permit)
      if call.block_end > now then
        ok, limit, remaining, reset, retry = blocked(call, decide, keys[k], now, f[2], f[3], f[4], permit, ok, limit, reset, retry)
      end
      -- put(out, n, r), inline and without a table: the common case, once
      -- per decision.
      if ok == 1 then
        if wkey then
          write_state(call, wkey, wtag, wvalue, wreset)
        end
        out[n + 4] = delay
      else
        out[n + 4] = retry
      end
      out[n + 1], out[n + 2], out[n + 3] = ok, remaining, reset
      n = n + 4
      k = k + 1
    else
      local m = -(number(args[a]) or 0)
      if m < 1 then
        error({err = 'ERR a batch request is a form index or -m, not ' .. tostring(args[a])})
      end
      -- Its extent first, should it fail.
      local permits, e = {}, a + 1
      for i = 1, m do
        local f = forms[args[e]]
        e = e + 1
        if f[5] then
          permits[i] = args[e]
          e = e + 1
        end
      end
      cursor.next_arg, cursor.next_key = e, k + m
      -- Several state keys: errors name theirs (see tagged_state).
      call.one_key = false
      local results, all, checks = {}, true, {}
      e = a + 1
      for i = 1, m do
        local f = forms[args[e]]
        e = e + 1
        if f[5] then
          e = e + 1
        end
        checks[i] = f
        local r = {decide_unless_blocked(call, f[1], keys[k + i - 1], now, f[2], f[3], f[4], permits[i])}
        results[i] = r
        if r[1] ~= 1 then
          all = false
        end
      end
      for i = 1, m do
        local r = results[i]
        if all then
          commit(call, r)
        elseif r[1] == 1 then
          local f = checks[i]
          r = {f[1](call, keys[k + i - 1], now, 0, f[3], f[4], permits[i])}
        end
        n = put(out, n, r)
      end
      a, k = e, k + m
    end
    cursor.arg, cursor.key, cursor.filled = a, k, n
  end
end

local function run_batch(keys, args)
  local call = new_call(number(args[1]) or 0, true)
  local now = server_now(call)
  local forms, a = {}, 3
  for f = 1, number(args[2]) do
    local name = args[a]
    forms[fmt(f)] = {ALGORITHMS[name], number(args[a + 1]), number(args[a + 2]), number(args[a + 3]), name == 'concurrency'}
    a = a + 4
  end
  local out = {}
  local cursor = {arg = a, key = 1, filled = 0, next_arg = a, next_key = 1}
  -- One protected call for the whole batch while no request fails: a
  -- request that fails does before writing anything, and the batch goes on
  -- after it.
  while cursor.arg <= #args do
    local ok, r = pcall(decide_requests, call, keys, args, forms, now, out, cursor)
    if ok then
      break
    end
    if type(r) == 'table' and r.err then
      r = r.err
    else
      r = tostring(r)
    end
    -- Its message in place of whatever it put before failing.
    for i = #out, cursor.filled + 1, -1 do
      out[i] = nil
    end
    cursor.filled = cursor.filled + 1
    out[cursor.filled] = r
    cursor.arg, cursor.key = cursor.next_arg, cursor.next_key
  end
  return out
end
