-- Merges counts of a peer region into this region's Redis: called by the
-- peer's sync tasks with the peer's own counts, one entry per key and
-- window of the peer's clock, each the cumulative count of that window.
--
-- KEYS[1]    `<prefix>:mr:arrived:<from>`: units heard from the peer, by
--            policy (read for the overshoot estimate)
-- KEYS[2]    `<prefix>:mr:rounds:<from>`: merges done, by round (mark.lua)
-- KEYS[3..]  the state hashes of the keys to merge (see decide.lua)
-- ARGV[1]    the sending region's name
-- ARGV[2]    the epoch of the sender's outbox
-- ARGV[3]    the fixed time in µs of this Redis's clock (tests), or 0 for
--            the server's TIME
-- ARGV[4]    the largest clock skew allowed between regions (µs)
-- ARGV[5]    the key prefix
-- ARGV[6]    the id of the sender's round
-- then for each hash: the window start (the sender's clock), the window
-- (µs), the sender's cumulative count.
--
-- Only this Redis's clock places counts: the part of a count not heard
-- before (above the `seen` field of that sender, epoch and window, so
-- replays, duplicates and reordering add nothing) is added to the sender's
-- field of the window of this clock in which it arrives. A count arrives
-- after it was admitted, so no count is ever placed before its time, and a
-- peer's clock, ahead or behind, never erases or hides a count here. An
-- entry whose window ended more than a window and the skew allowed ago (by
-- this clock) is not written (its `seen` field would be gone, so a replay
-- would count it again); since the sender still held it, its clock may be
-- behind by more than allowed, so the round records (`<round>:late` in
-- KEYS[2]) until when the count would have counted here, and its mark
-- has the sender counted at its share until then. Fields whose window is
-- over by this clock are dropped; TTLs are only ever extended. Returns the
-- units added.

-- idiv, fmt: redis/lua/numbers.lua; parse_field, extend_ttl, ttl_ms: fields.lua;
-- both come first.

local now = tonumber(ARGV[3])
local fixed = now > 0
if not fixed then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local from, epoch = ARGV[1], ARGV[2]
local max_skew = tonumber(ARGV[4])
local policy_at = #ARGV[5] + 2

local added = 0
local late = 0
local by_policy = {}
for i = 3, #KEYS do
  local hash = KEYS[i]
  local at = 7 + (i - 3) * 3
  local start, w, value = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  if start + 2 * w + max_skew > now then
    local seen = from .. '@' .. epoch .. ':' .. fmt(start) .. ':' .. fmt(w)
    local known = tonumber(redis.call('HGET', hash, seen) or '0') or 0
    if value > known then
      local here = idiv(now, w) * w
      redis.call('HSET', hash, seen, fmt(value))
      redis.call('HINCRBY', hash, from .. ':' .. fmt(here) .. ':' .. fmt(w), fmt(value - known))
      added = added + value - known
      local policy = string.match(string.sub(hash, policy_at), '^([^:]+):{')
      if policy ~= nil then
        by_policy[policy] = (by_policy[policy] or 0) + value - known
      end
      -- The seen field matters until the sender's window is over (bounded
      -- by this clock, whatever the sender's says).
      local keep = math.min(start + 2 * w + max_skew, now + 2 * w + max_skew)
      extend_ttl(hash, ttl_ms(math.max(here + 2 * w, keep), now, fixed))
      local fields = redis.call('HKEYS', hash)
      local expired = {}
      for f = 1, #fields do
        local kind, _, s, w0 = parse_field(fields[f], w)
        if (kind == 'count' and s + 2 * w0 <= now)
          or (kind == 'seen' and s + 2 * w0 + max_skew <= now) then
          expired[#expired + 1] = fields[f]
        end
      end
      if #expired > 0 then
        redis.call('HDEL', hash, unpack(expired))
      end
    end
  else
    local until_us = idiv(now, w) * w + 2 * w
    if until_us > late then
      late = until_us
    end
  end
end
if late > 0 then
  local field = ARGV[6] .. ':late'
  local was = tonumber(redis.call('HGET', KEYS[2], field) or '0') or 0
  if late > was then
    redis.call('HSET', KEYS[2], field, fmt(late))
  end
end
for policy, units in pairs(by_policy) do
  redis.call('HINCRBY', KEYS[1], policy, fmt(units))
end
if added > 0 then
  extend_ttl(KEYS[1], 86400000)
end
-- Last: this merge ran whole.
redis.call('HINCRBY', KEYS[2], ARGV[6], 1)
redis.call('PEXPIRE', KEYS[2], 60000)
return fmt(added)
