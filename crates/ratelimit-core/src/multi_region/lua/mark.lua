-- Marks a peer region heard, in this region's Redis: called by the peer's
-- sync task once every count its outbox held when the round's last read
-- ran has landed here (merge.lua). The mark carries a ticket (this Redis's
-- time, returned by an earlier call): every count the peer admitted before
-- that instant is here. Decisions count a peer whose freshest mark is
-- older than the staleness at its conservative share (decide.lua).
--
-- KEYS[1]  `<prefix>:mr:heard:<from>`, a hash: `born` (when it was created:
--          the generation of what landed here), `at` (the freshest ticket,
--          TIME µs), the last clock sample (`lo` and `hi`, bounds of the
--          sender's clock minus this one's, µs) and `skewed` (1 when the
--          bounds lie beyond the skew allowed, or a merge found counts
--          over by this clock that the sender still held), `late`
--          (until when, by this clock, such counts would have counted),
--          and `epoch` and `seq` (how far the sender's outbox was
--          delivered here)
-- ARGV[1]  the ticket: TIME µs of this Redis at an earlier call; 0 asks
--          for a ticket only (nothing claimed, nothing written)
-- ARGV[2]  the ticket: this Redis's clock then (the fixed time in tests)
-- ARGV[3]  the sender's clock when its round's last read of its outbox ran
-- ARGV[4]  the fixed time in µs of this Redis's clock (tests), or 0 for TIME
-- ARGV[5]  the TTL of the hash, in ms
-- ARGV[6]  the largest clock skew allowed between regions (µs)
-- ARGV[7]  the generation the round relies on: the `born` its outbox cursor
--          was delivered into, or empty when the round pushed the sender's
--          whole outbox
-- ARGV[8]  the round's id, and ARGV[9] the number of merges it sent: each
--          merge counts itself done in KEYS[2] (`<prefix>:mr:rounds:<from>`)
--          as its last step, so a round marks only if all of them ran
--          whole before the mark
-- ARGV[10] 1 when the round read the outbox to its end (it claims the
--          ticket); 0 when it read only part of a longer backlog: then it
--          only learns the generation its part landed in, marking nothing
-- ARGV[11] the sender's cursor the round relies on (a sequence number of
--          its outbox: everything up to it was delivered here), ARGV[12]
--          the epoch of the sender's outbox, ARGV[13] the sequence number
--          the round delivers up to; the hash keeps how far it was
--          delivered (`epoch`, `seq`): set by a round that pushed the whole
--          outbox, only raised by one that relies on a cursor
--
-- A round that relies on a generation claims what earlier rounds delivered
-- into it: if this hash is missing or was born again since (this Redis lost
-- its data, or the sender was silent past the TTL), or says less was
-- delivered than the cursor does (this Redis came back from a snapshot
-- older than the last deliveries: the same generation, but not all that
-- landed in it), nothing is marked and the sender must push its whole
-- outbox again. Returns this Redis's TIME
-- and clock (the next ticket), then 1 when marked, 0 when the sender must
-- start over, 2 when a merge of the round had not run, and the generation
-- marked.

-- idiv, fmt: redis/lua/numbers.lua; parse_field, extend_ttl: fields.lua;
-- both come first.

local t = redis.call('TIME')
local real_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = tonumber(ARGV[4])
if now == 0 then
  now = real_now
end
local ticket, ticket_clock = tonumber(ARGV[1]), tonumber(ARGV[2])
if ticket == 0 then
  return {fmt(real_now), fmt(now), 0, ''}
end
local sender_clock = tonumber(ARGV[3])
local max_skew = tonumber(ARGV[6])
local relied = ARGV[7]
local done = tonumber(redis.call('HGET', KEYS[2], ARGV[8]) or '0') or 0
local late = tonumber(redis.call('HGET', KEYS[2], ARGV[8] .. ':late') or '0') or 0
redis.call('HDEL', KEYS[2], ARGV[8], ARGV[8] .. ':late')
if done ~= tonumber(ARGV[9]) then
  return {fmt(real_now), fmt(now), 2, ''}
end

local heard = redis.call('HMGET', KEYS[1], 'born', 'at', 'late', 'epoch', 'seq')
local born = heard[1]
local epoch = ARGV[12]
local delivered = tonumber(heard[5] or '0') or 0
if heard[4] ~= epoch then
  delivered = 0
end
if relied ~= '' and (born ~= relied or delivered < tonumber(ARGV[11])) then
  return {fmt(real_now), fmt(now), 0, ''}
end
-- A whole push sets what was delivered anew (a new epoch's sequence
-- numbers start low); rounds on a cursor only raise it.
local seq = tonumber(ARGV[13])
if relied ~= '' and delivered > seq then
  seq = delivered
end
if born == false then
  born = fmt(real_now)
end
-- A merge of the round found counts over by this clock that the sender
-- still held: the sender counts at its share until they would have
-- expired here (decide.lua), and shows as skewed until its next mark.
local late_until = tonumber(heard[3] or '0') or 0
if late > late_until then
  late_until = late
end
if ARGV[10] ~= '1' then
  redis.call('HSET', KEYS[1], 'born', born, 'late', fmt(late_until), 'epoch', epoch, 'seq', fmt(seq))
  if late > 0 then
    redis.call('HSET', KEYS[1], 'skewed', 1)
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return {fmt(real_now), fmt(now), 1, born}
end
local at = tonumber(heard[2] or '0') or 0
if ticket > at then
  at = ticket
end
-- The sender read its clock after the ticket and before this call.
local lo, hi = sender_clock - now, sender_clock - ticket_clock
local skewed = 0
if lo > max_skew or hi < -max_skew or late > 0 then
  skewed = 1
end
redis.call('HSET', KEYS[1], 'born', born, 'at', fmt(at), 'lo', fmt(lo), 'hi', fmt(hi), 'skewed', skewed, 'late', fmt(late_until), 'epoch', epoch, 'seq', fmt(seq))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {fmt(real_now), fmt(now), 1, born}
