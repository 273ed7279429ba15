-- Shared helpers of the rate-limit scripts. A script holds the prelude and
-- only the other helper files it uses (state.lua, members.lua, blocks.lua,
-- tat.lua; see scripts.rs): every helper is a closure Redis creates again on
-- every call of a script.
--
-- Every time is an integer number of microseconds, below 2^53 (policy
-- validation guarantees it for every value computed here), divided with
-- `idiv` and sent to Redis through `fmt` (numbers.lua, before the prelude).
--
-- The fixed time (ARGV[1]; for one decision, single.lua, its args[4]; kept
-- in the call's context, see new_call) is 0 or absent in production: the
-- time is the Redis server's TIME, never the client's clock. Tests may pass
-- a fixed time there to replay a timeline.
--
-- An admin block (AdminStore::block, block.lua) lives in the state key
-- `<prefix>:<policy>:{<key>}` itself, in front of the state:
-- "b<end>;<state>", `end` the time (µs) the block ends; while it is later
-- than now every check of the key is denied and consumes nothing (see
-- blocks.lua). A decision finds it in the read it makes anyway, so a key
-- that is not blocked costs nothing more (a block key of its own would cost
-- Redis a read and a key per decision).

-- A script that fails half-way keeps its earlier writes: the store checks
-- once per connection, before any script runs, that the Redis user may run
-- every write command on its keys (acl_probe.lua), so no key is ever left
-- without its TTL by an ACL too tight.

local ALGORITHMS = {}

-- idiv and fmt: numbers.lua, which comes first.

local function positive(n)
  if n > 0 then
    return n
  end
  return 0
end

-- The context of one call (a script's run, a function's call): what its
-- helpers share while it runs, passed to each as `call`. The library is
-- loaded once and shared by every client of its Redis, so nothing about a
-- call may live at chunk level, where it would outlast the call. Fields:
--   fixed: the fixed time (0: server TIME);
--   one_key: whether the call decides over one state key only (single.lua):
--     its errors then name no key (see tagged_state, state.lua);
--   block_end, block_text: the block found in front of the state the last
--     read returned (state.lua: tagged_state, members.lua: read_entries, or
--     unblocked below): when it ends (µs; 0 when there was none) and its
--     text "b<end>;", which a state written back while the block runs keeps
--     in front (rewrite); block_text is set only with a block_end above 0;
--   fw_last, fw_prefix: the fixed window's text of a window end (see
--     fixed_window_prefix), kept while the call runs.
local function new_call(fixed, one_key)
  return {fixed = fixed, one_key = one_key, block_end = 0}
end

-- tonumber of a numeric string that calls repeat (a policy's parameters, a
-- cost, TIME's seconds, a window's start, a count), set once when the chunk
-- runs: tonumber itself in a script (eval.lua), tonumber called inside a
-- function in the library, whose loading runs without the global library
-- (library.lua).
local number

local function server_now(call)
  if call.fixed > 0 then
    return call.fixed
  end
  local t = redis.call('TIME')
  -- The microseconds change on every call: not worth remembering.
  return number(t[1]) * 1000000 + tonumber(t[2])
end

-- The TTL, in whole milliseconds rounded up, of state that matters for
-- `reset` more microseconds. A replayed test timeline runs at its own pace,
-- so its keys get an hour of slack instead of expiring in real time.
local ttl_text = fmt
local function ttl_ms(call, reset)
  local ms = idiv(reset + 999, 1000)
  if call.fixed > 0 then
    ms = ms + 3600000
  end
  return ttl_text(ms)
end

local BLOCK_BYTE = 98 -- string.byte('b'): loading has no string library

-- `raw` (a GET reply: a string or false) without the block in front of it,
-- nil when nothing follows the block; notes the block in call.block_end and
-- call.block_text (no block: block_end 0). The common case, a state without
-- a block, costs one byte's comparison.
local function unblocked(call, raw)
  call.block_end = 0
  if not raw or string.byte(raw) ~= BLOCK_BYTE then
    return raw or nil
  end
  local stop = string.find(raw, ';', 2, true)
  if not stop then
    return nil
  end
  call.block_end, call.block_text = tonumber(string.sub(raw, 2, stop - 1)) or 0, string.sub(raw, 1, stop)
  if stop == #raw then
    return nil
  end
  return string.sub(raw, stop + 1)
end

-- Writes `value` (its tag included; nil: no state) as the state of `key`,
-- the key the last read returned, fresh again in `reset` µs (nil: the key
-- keeps its TTL), keeping in front the block read with it while that runs
-- at `now` (the key then lives at least as long as the block). For the
-- writes that may happen while a key is blocked (penalties, releases, the
-- drop of expired entries); a decision writes only when not blocked
-- (write_state, state.lua), and a block that has ended goes with the write.
local function rewrite(call, key, value, reset, now)
  local block_end = call.block_end
  if block_end > now then
    value = call.block_text .. (value or '')
    if reset then
      if block_end - now > reset then
        reset = block_end - now
      end
      redis.call('SET', key, value, 'PX', ttl_ms(call, reset))
    else
      redis.call('SET', key, value, 'KEEPTTL')
    end
  elseif not value or reset == 0 then
    redis.call('DEL', key)
  elseif reset then
    redis.call('SET', key, value, 'PX', ttl_ms(call, reset))
  else
    redis.call('SET', key, value, 'KEEPTTL')
  end
end

-- State families. A policy may keep its name and change algorithm (a restart
-- against a shared Redis, a policy removed and brought back): its keys may
-- then hold another algorithm's state, which must never be read as its own.
-- A script that meets one fails before writing anything, with
-- `RATELIMIT_CONFLICT <key>` (RedisStore: StoreError::PolicyConflict, as
-- MemoryStore answers).
--
-- States are strings that carry the tag of their family (state.lua; the
-- sliding log and the semaphore, concurrency.lua and sliding_log.lua). A
-- sorted set left by an earlier version is converted on its first touch
-- (members.lua), or is a conflict when it belongs to another family.
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

-- "12 345 6" -> {12, 345, 6}
local function ints(raw)
  local out = {}
  for part in string.gmatch(raw, '%d+') do
    out[#out + 1] = tonumber(part)
  end
  return out
end

-- Operations that must count once however often they are sent (refunds,
-- rewards, penalties): the store sends a command again when its connection
-- broke before the reply came, and the first one may have run. Each
-- carries an id, 32 hex digits, the same in every resend. The ids applied
-- are remembered in a key beside the state (`applied`: the state key's name
-- and ':applied', in its slot), a string of the newest 128 ids, which lives
-- as long as the states the operation touched: a resend finds its id and
-- changes nothing. (GET, SET and PTTL: the commands every state uses.)

-- The ids remembered at `applied`, and whether `id` is one of them; an id
-- that is not 32 hex digits is an error.
local function applied_ids(applied, id)
  if type(id) ~= 'string' or #id ~= 32 or string.find(id, '%X') then
    error({err = 'ERR an operation id is 32 hex digits'})
  end
  local ids = redis.call('GET', applied) or ''
  local from = 1
  while true do
    local at = string.find(ids, id, from, true)
    if not at then
      return ids, false
    end
    -- A match at an id's start only.
    if at % 32 == 1 then
      return ids, true
    end
    from = at + 1
  end
end

-- Remembers `id` after `ids` (as applied_ids read them) at `applied`, the
-- newest 128 kept, for `lives` ms (the longest PTTL of the states the
-- operation touched, before or after it), never less than they were kept
-- already; nothing when no state lives (nothing to give twice).
local function remember_applied(applied, ids, id, lives)
  local kept = redis.call('PTTL', applied)
  if kept > lives then
    lives = kept
  end
  if lives <= 0 then
    return
  end
  if #ids >= 128 * 32 then
    ids = string.sub(ids, #ids - 127 * 32 + 1)
  end
  redis.call('SET', applied, ids .. id, 'PX', fmt(lives))
end
