-- Several independent requests in one call: the store's coalescing (see
-- coalesce.rs) gathers the requests that arrive while a call is in flight
-- and sends them together, as the library's batch function (FCALL) or, where
-- functions cannot be used, as a script with the same keys and arguments.
--
-- keys: the state key of every check of every request, in order (an admin
-- block is in the state key, see the prelude).
-- args[1]: fixed time (0 = server TIME); args[2]: the number of forms f,
-- then four values per form: algorithm, cost, two policy parameters (a form
-- is what a check asks, besides its key: a batch has few, each sent once).
-- Then per request: a form's index (1-based) for a request of one check, or
-- -m for a request of m checks followed by their m forms' indexes. A check
-- of a concurrency form is followed by its permit id.
-- (Arguments cost Redis about 800 instructions each: six per check made
-- a third of a batched decision's work; callgrind, see coalesce.rs.)
--
-- The requests are decided one after the other, each with its writes applied
-- before the next reads: as if each had been its own call, in this order. A
-- request of one check is decided as single.lua decides it; a request of
-- several checks as multi.lua does (all or nothing; the checks that would
-- have allowed report a peek), without the states multi.lua reports for
-- refunds.
--
-- Reply: an array whose first value is one string of 25 bytes per check, in
-- order: allowed (one byte, 1 or 0), then remaining, reset and wait (wait:
-- the retry of a denial, the delay of an admission; the limit is the form's
-- first parameter, which the client knows), each a little-endian double
-- (struct.pack '<Bddd'). A request that fails (a policy conflict) has one
-- record of allowed 2 in place of its checks, and its error message follows
-- the string, in the order of the failures; the other requests go on.
-- (One string costs Redis no more than 4 integers per check, and the client
-- reads it without a value per number: callgrind, see BATCH_RECORD in
-- replies.rs.)

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

-- Where the requests not yet decided start (args[BATCH_ARG], keys[BATCH_KEY]),
-- how far the reply is filled, and
-- where the request being decided ends: decide_requests leaves them right
-- for run_batch to go on after a request that fails.
local BATCH_ARG, BATCH_KEY, BATCH_FILLED, BATCH_NEXT_ARG, BATCH_NEXT_KEY = 0, 0, 0, 0, 0

-- Decides the requests from BATCH_ARG on, filling `out`.
local function decide_requests(keys, args, forms, now, out)
  local a, k, n = BATCH_ARG, BATCH_KEY, BATCH_FILLED
  local last = #args
  while a <= last do
    -- Until its extent is known, a failure ends the batch.
    BATCH_NEXT_ARG = last + 1
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
      BATCH_NEXT_ARG, BATCH_NEXT_KEY = a, k + 1
      ONE_STATE_KEY = true
      local decide = f[1]
      local ok, limit, remaining, reset, retry, delay, wkey, wtag, wvalue, wreset = decide(keys[k], now, f[2], f[3], f[4], permit)
      if BLOCK_END > now then
        ok, limit, remaining, reset, retry = blocked(decide, keys[k], now, f[2], f[3], f[4], permit, ok, limit, reset, retry)
      end
      -- put(out, n, r), inline and without a table: the common case, once
      -- per decision.
      if ok == 1 then
        if wkey then
          write_state(wkey, wtag, wvalue, wreset)
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
      -- Its extent first, for run_batch should it fail.
      local permits, e = {}, a + 1
      for i = 1, m do
        local f = forms[args[e]]
        e = e + 1
        if f[5] then
          permits[i] = args[e]
          e = e + 1
        end
      end
      BATCH_NEXT_ARG, BATCH_NEXT_KEY = e, k + m
      -- Several state keys: errors name theirs (see tagged_state).
      ONE_STATE_KEY = false
      local results, all, checks = {}, true, {}
      e = a + 1
      for i = 1, m do
        local f = forms[args[e]]
        e = e + 1
        if f[5] then
          e = e + 1
        end
        checks[i] = f
        local r = {decide_unless_blocked(f[1], keys[k + i - 1], now, f[2], f[3], f[4], permits[i])}
        results[i] = r
        if r[1] ~= 1 then
          all = false
        end
      end
      for i = 1, m do
        local r = results[i]
        if all then
          commit(r)
        elseif r[1] == 1 then
          local f = checks[i]
          r = {f[1](keys[k + i - 1], now, 0, f[3], f[4], permits[i])}
        end
        n = put(out, n, r)
      end
      a, k = e, k + m
    end
    BATCH_FILLED = n
  end
  BATCH_ARG = a
end

-- The batch's own arguments start at args[base] (1, or after the keys a
-- master's batch passes as arguments: see the library).
local function run_batch(keys, args, base)
  FIXED_NOW = number(args[base]) or 0
  local now = server_now()
  local forms, a = {}, base + 2
  for f = 1, number(args[base + 1]) do
    local name = args[a]
    forms[fmt(f)] = {ALGORITHMS[name], number(args[a + 1]), number(args[a + 2]), number(args[a + 3]), name == 'concurrency'}
    a = a + 4
  end
  -- The records' string first, then the failures' messages.
  local out, reply = {}, {false}
  BATCH_ARG, BATCH_KEY, BATCH_FILLED = a, 1, 0
  -- One protected call for the whole batch while no request fails: a
  -- request that fails does before writing anything, and the batch goes on
  -- after it.
  while BATCH_ARG <= #args do
    local ok, r = pcall(decide_requests, keys, args, forms, now, out)
    if ok then
      break
    end
    -- Its error goes as a string (an error inside an array would fail the
    -- whole reply in clients).
    if type(r) == 'table' and r.err then
      r = r.err
    else
      r = tostring(r)
    end
    -- A record of allowed 2 in place of what it put before failing, if
    -- anything.
    for i = #out, BATCH_FILLED + 1, -1 do
      out[i] = nil
    end
    local n = BATCH_FILLED
    out[n + 1], out[n + 2], out[n + 3], out[n + 4] = 2, 0, 0, 0
    BATCH_FILLED = n + 4
    reply[#reply + 1] = r
    BATCH_ARG, BATCH_KEY = BATCH_NEXT_ARG, BATCH_NEXT_KEY
  end
  -- Packed in parts: unpack takes a few thousand values at most.
  local n = #out
  local last = math.min(n, 4000)
  local packed = struct.pack('<' .. string.rep('Bddd', last / 4), unpack(out, 1, last))
  for first = 4001, n, 4000 do
    last = math.min(first + 3999, n)
    packed = packed .. struct.pack('<' .. string.rep('Bddd', (last - first + 1) / 4), unpack(out, first, last))
  end
  reply[1] = packed
  return reply
end
