-- Shared helpers of the rate-limit scripts.
--
-- Every time is an integer number of microseconds. Lua numbers are doubles,
-- exact for integers below 2^53, which policy validation guarantees for every
-- value computed here. Two traps are avoided on purpose:
--   * `a / b` can round up across an integer, so integer division goes
--     through `idiv`, which corrects the quotient;
--   * numbers passed to redis.call are turned into strings with 14 digits,
--     so every number sent to Redis goes through `fmt` first.
--
-- ARGV[1] is 0 in production: the time is the Redis server's TIME, never the
-- client's clock. Tests may pass a fixed time there to replay a timeline.
--
-- Every state key `<prefix>:<policy>:{<key>}` may have a block key next to
-- it, `<state key>:block` (same hash tag, same cluster slot), written by
-- block.lua: while it holds a time (µs) later than now, every check of the
-- state key is denied and consumes nothing.

if redis.replicate_commands then
  redis.replicate_commands()
end

-- A script that fails half-way keeps its earlier writes: the store checks
-- once per connection, before any script runs, that the Redis user may run
-- every write command on its keys (acl_probe.lua), so no key is ever left
-- without its TTL by an ACL too tight.

local ALGORITHMS = {}

local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function fmt(n)
  return string.format('%d', n)
end

local function positive(n)
  if n > 0 then
    return n
  end
  return 0
end

local FIXED_NOW = tonumber(ARGV[1]) or 0

local function server_now()
  if FIXED_NOW > 0 then
    return FIXED_NOW
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The TTL, in whole milliseconds rounded up, of state that matters for
-- `reset` more microseconds. A replayed test timeline runs at its own pace,
-- so its keys get an hour of slack instead of expiring in real time.
local function ttl_ms(reset)
  local ms = idiv(reset + 999, 1000)
  if FIXED_NOW > 0 then
    ms = ms + 3600000
  end
  return fmt(ms)
end

-- State families. A policy may keep its name and change algorithm (a restart
-- against a shared Redis, a policy removed and brought back): its keys may
-- then hold another algorithm's state, which must never be read as its own.
-- A script that meets one fails before writing anything, with
-- `RATELIMIT_CONFLICT <key>` (RedisStore: StoreError::PolicyConflict, as
-- MemoryStore answers).
--
-- String states start with the tag of their family, read and written only by
-- read_state and write_state:
local TAG = {
  fixed_window = 'f', -- "f<window start> <count>"
  sliding_window = 'w', -- "w<window start> <previous> <current>"
  token_bucket = 't', -- "t<tokens> <last refill>"
  tat = 'g', -- GCRA and leaky bucket, one shared state: "g<tat>"
}
-- Sorted-set states (sliding log, concurrency) tell their family by their
-- members, see holds_members. Either kind found where the other is expected
-- is a WRONGTYPE, and a conflict too.

local function conflict(key)
  error({err = 'RATELIMIT_CONFLICT ' .. key})
end

-- Whether `reply`, from redis.pcall on a state key, is WRONGTYPE (another
-- family's state); any other error is raised as redis.call would.
local function wrong_type(reply)
  if type(reply) == 'table' and reply.err then
    if string.sub(reply.err, 1, 9) == 'WRONGTYPE' then
      return true
    end
    error(reply)
  end
  return false
end

-- The string state of `key` without its tag, nil when there is none; a
-- conflict when it belongs to another family. A state written before states
-- were tagged starts with a digit: it is read as the caller's own, as it
-- always was (it expires within its TTL).
local function read_state(key, tag)
  local raw = redis.pcall('GET', key)
  if wrong_type(raw) then
    conflict(key)
  end
  if not raw then
    return nil
  end
  local found = string.sub(raw, 1, 1)
  if found == tag then
    return string.sub(raw, 2)
  elseif string.find(found, '^%d') then
    return raw
  end
  conflict(key)
end

-- Saves a string state with its tag for `reset` more µs, or deletes it when it
-- is back to fresh (reset 0).
local function write_state(key, tag, value, reset)
  if reset > 0 then
    redis.call('SET', key, tag .. value, 'PX', ttl_ms(reset))
  else
    redis.call('DEL', key)
  end
end

-- Whether the sorted set `key` is missing or holds members of `family`:
-- 'permits' (concurrency) "<permit id>:<units>", the id 32 hex digits
-- (PermitId's Display), or 'log' (sliding log) "<t>:<cost>", t below 2^53, so
-- at most 16 digits. Every member of a key comes from one family: the first
-- one tells.
local function holds_members(key, family)
  local first = redis.pcall('ZRANGE', key, 0, 0)
  if wrong_type(first) then
    return false
  end
  if not first[1] then
    return true
  end
  local id = string.match(first[1], '^(%x+):')
  local permit = id ~= nil and #id == 32
  return permit == (family == 'permits')
end

-- A conflict unless `key` is missing or a sorted set of `family`.
local function check_members(key, family)
  if not holds_members(key, family) then
    conflict(key)
  end
end

local function expire_or_delete(key, reset)
  if reset > 0 then
    redis.call('PEXPIRE', key, ttl_ms(reset))
  else
    redis.call('DEL', key)
  end
end

-- "12 345 6" -> {12, 345, 6}
local function ints(raw)
  local out = {}
  for part in string.gmatch(raw, '%d+') do
    out[#out + 1] = tonumber(part)
  end
  return out
end

-- How long `block_key` still blocks its state key, in µs (0: not blocked).
local function block_left(block_key, now)
  if not block_key then
    return 0
  end
  local raw = redis.call('GET', block_key)
  if not raw then
    return 0
  end
  return positive(tonumber(raw) - now)
end

-- The reply for a blocked key, `left` µs before the block ends: denied,
-- nothing remaining, full again when both the block and the state allow
-- (`peek`: the algorithm's reply at cost 0), retried when both the block and
-- the algorithm allow the request (`r`: its reply, never committed).
local function blocked_reply(r, peek, left)
  local retry = left
  if r[1] ~= 1 and r[5] > retry then
    retry = r[5]
  end
  local reset = peek[4]
  if left > reset then
    reset = left
  end
  return {0, r[2], 0, reset, retry, 0}
end

-- One check of `key` by `decide`, honouring its block key: the algorithm's
-- reply (and its commit) when not blocked, a denial without commit when
-- blocked.
local function decide_unless_blocked(decide, key, block_key, now, cost, p1, p2, permit)
  local left = block_left(block_key, now)
  local r = decide(key, now, cost, p1, p2, permit)
  if left == 0 then
    return r
  end
  local peek = r
  if r[1] == 1 and cost > 0 then
    peek = decide(key, now, 0, p1, p2, permit)
  end
  return blocked_reply(r, peek, left)
end

-- The shared transition of GCRA and the leaky bucket. State (string, tag
-- TAG.tat): the theoretical arrival time.
local function decide_tat(key, now, cost, capacity, interval, with_delay)
  local tat = 0
  local raw = read_state(key, TAG.tat)
  if raw then
    tat = tonumber(raw)
  end
  local span = capacity * interval
  local slot = tat
  if now > slot then
    slot = now
  end
  local new_tat = slot + cost * interval
  if new_tat - now > span then
    local reset = positive(tat - now)
    return {0, capacity, idiv(positive(span - reset), interval), reset, new_tat - now - span, 0}
  end
  if cost > 0 then
    tat = new_tat
  end
  local reset = positive(tat - now)
  local delay = 0
  if with_delay then
    delay = slot - now
  end
  local r = {1, capacity, idiv(span - reset, interval), reset, 0, delay}
  if cost > 0 then
    r.commit = function()
      write_state(key, TAG.tat, fmt(tat), reset)
    end
  end
  return r
end
