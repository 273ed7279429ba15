-- Admin penalties and rewards (AdminStore::penalize and ::reward) and
-- refunds (Store::refund): one transition of adjust.lua on one key.
--
-- KEYS[1]: the state key (an admin block is in it, see the prelude);
-- KEYS[2]: the ids of the operations applied to it (see applied_ids in the
-- prelude). ARGV: fixed time (0 = server TIME), 'penalize', 'reward' or
-- 'refund', algorithm, amount (at most four times the limit: no state holds
-- more, and the arithmetic stays exact), two policy parameters, the
-- operation's id (32 hex digits, the same when the store sends it again:
-- an operation applied already changes nothing).
-- Reply: {allowed, limit, remaining, reset_after, retry_after, delay}, what a
-- peek (cost 0) reports afterwards, block included.
local call = new_call(tonumber(ARGV[1]) or 0, false)
local now = server_now(call)
local operation, algorithm = ARGV[2], ARGV[3]
if not ADJUST[algorithm] then
  return redis.error_reply('ERR ' .. operation .. ' does not apply to ' .. algorithm)
end
return {adjust_once(call, KEYS[1], KEYS[2], ARGV[7], operation, algorithm, tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), now)}
