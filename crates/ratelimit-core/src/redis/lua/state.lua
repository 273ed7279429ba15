-- String states (fixed window, sliding window counter, token bucket, GCRA,
-- leaky bucket) start with the tag of their family, read by tagged_state
-- (admin.lua: read_state) and written by write_state:
local TAG = {
  fixed_window = 'f', -- "f<window's last µs> <count>"
  sliding_window = 'w', -- "w<window's last µs> <previous> <current>"
  token_bucket = 't', -- "t<tokens> <last refill>"
  tat = 'g', -- GCRA and leaky bucket, one shared state: "g<tat>"
  -- 'l': the sliding log, binary entries (sliding_log.lua: LOG_TAG);
  -- 'c': the semaphore, binary entries (concurrency.lua).
}
-- Each algorithm writes its state, tag included, with one string.format of
-- its own format (TAT_STATE and the like, next to its decision): one call
-- instead of a format per number and a concatenation per field. The fixed
-- window joins texts it keeps instead (fixed_window_text).

-- The string state of `key` without its tag, nil when there is none; a
-- conflict when it belongs to another family. A state written before states
-- were tagged starts with a digit: it is read as the caller's own, as it
-- always was (it expires within its TTL).
--
-- A decision over one state key (single.lua) lets Redis's own WRONGTYPE
-- through, which the store reports as a conflict of that key's policy, and
-- saves a protected call; several keys (multi.lua, admin.lua) name theirs.
--
-- tagged_state answers the state as stored, its tag (`tag_byte`, the tag's
-- string.byte) included when it has one: the decisions read its numbers
-- with one string.match, without cutting the tag off first. A block in
-- front of the state (see the prelude) is noted in call.block_end and cut
-- off.
local function tagged_state(call, key, tag_byte)
  local raw
  if call.one_key then
    raw = redis.call('GET', key)
  else
    raw = redis.pcall('GET', key)
    if wrong_type(raw) then
      conflict(key)
    end
  end
  call.block_end = 0
  if not raw then
    return nil
  end
  local found = string.byte(raw)
  if found == BLOCK_BYTE then
    raw = unblocked(call, raw)
    if not raw then
      return nil
    end
    found = string.byte(raw)
  end
  -- 48..57: the digits.
  if found == tag_byte or (found and found >= 48 and found <= 57) then
    return raw
  end
  conflict(key)
end

-- The first two (three) numbers of a state as tagged_state answers it: its
-- numbers in order, whatever separates them, as `ints` reads them; one
-- string.match in the common case, each number read by `parse`
-- (`number` for those that repeat across keys, else tonumber), the last
-- one of two by `parse_last`.
local function state_numbers2(raw, parse, parse_last)
  local a, b = string.match(raw, '(%d+)%D+(%d+)')
  if a then
    return parse(a), parse_last(b)
  end
  local s = ints(raw)
  return s[1], s[2]
end

-- Saves a string state with its tag for `reset` more µs, or deletes it when it
-- is back to fresh (reset 0). A `tag` of false: `value` carries its tag
-- already (one string.format made both, see TAG).
local function write_state(call, key, tag, value, reset)
  if reset > 0 then
    if tag then
      value = tag .. value
    end
    redis.call('SET', key, value, 'PX', ttl_ms(call, reset))
  else
    redis.call('DEL', key)
  end
end

-- A decision (ALGORITHMS[...]), called as decide(call, key, now, cost, p1,
-- p2, permit), returns its reply as values, not a table:
-- allowed (1 or 0), limit, remaining, reset, retry, delay, then, when it
-- would write a string state, the write: its key, its tag (false when the
-- value carries it), its value and its reset (write_state's arguments).
-- A table per decision, or a closure for the write, costs Redis measurably
-- more per batched decision. Where replies must wait (a request
-- of several checks, all or nothing: multi.lua, batch.lua), they are kept
-- as tables, r[1..6] the reply and r[7..10] the write; commit applies the
-- write and clears r[7..10] (Redis replies with an array up to its first
-- nil, so a committed reply is the six fields again).
local function commit(call, r)
  if r[7] then
    write_state(call, r[7], r[8], r[9], r[10])
    r[7], r[8], r[9], r[10] = nil, nil, nil, nil
  end
end

-- Whether `r` writes when committed.
local function writes(r)
  return r[7] ~= nil
end
