-- Settles the reservations of one request to what it really cost
-- (Store::settle), every limit in one call: a cost above the reservation is
-- charged as a penalty of the difference (a debt past the limit), one below
-- gives the difference back as a refund, an equal one changes nothing. The
-- reference is `Algorithm::settle` (crates/ratelimit-core/src/policy.rs).
--
-- With n limits, KEYS[2i - 1]: the state key of limit i (an admin block is in
-- it, see the prelude); KEYS[2i]: the ids of the operations applied to it
-- (see applied_ids in the prelude). ARGV[1]: fixed time (0 = server TIME);
-- ARGV[2]: the settlement's id (32 hex digits, the same in every resend: a
-- limit that applied it already changes nothing); then five values per
-- limit: algorithm, 'penalize', 'refund' or 'peek', amount (at most four
-- times the limit), two policy parameters.
-- Reply: per limit, {allowed, limit, remaining, reset_after, retry_after,
-- delay}, what a peek reports afterwards, block included.
--
-- All or nothing: every state is read, its family checked, before anything
-- is written, so a conflict fails the call with nothing settled.
local call = new_call(tonumber(ARGV[1]) or 0, false)
local now = server_now(call)
local n = #KEYS / 2
for i = 1, n do
  local a = 3 + (i - 1) * 5
  local algorithm = ARGV[a]
  if not ADJUST[algorithm] then
    return redis.error_reply('ERR settle does not apply to ' .. algorithm)
  end
  ALGORITHMS[algorithm](call, KEYS[2 * i - 1], now, 0, tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), '')
end
local out = {}
for i = 1, n do
  local a = 3 + (i - 1) * 5
  out[i] = {adjust_once(call, KEYS[2 * i - 1], KEYS[2 * i], ARGV[2], ARGV[a + 1], ARGV[a], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), now)}
end
return out
