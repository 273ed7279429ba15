-- String states (fixed window, sliding window counter, token bucket, GCRA,
-- leaky bucket) start with the tag of their family, read and written only by
-- read_state and write_state:
local TAG = {
  fixed_window = 'f', -- "f<window start> <count>"
  sliding_window = 'w', -- "w<window start> <previous> <current>"
  token_bucket = 't', -- "t<tokens> <last refill>"
  tat = 'g', -- GCRA and leaky bucket, one shared state: "g<tat>"
}

-- The string state of `key` without its tag, nil when there is none; a
-- conflict when it belongs to another family. A state written before states
-- were tagged starts with a digit: it is read as the caller's own, as it
-- always was (it expires within its TTL).
--
-- A decision over one state key (single.lua) lets Redis's own WRONGTYPE
-- through, which the store reports as a conflict of that key's policy, and
-- saves a protected call; several keys (multi.lua, admin.lua) name theirs.
local function read_state(key, tag)
  local raw
  if ONE_STATE_KEY then
    raw = redis.call('GET', key)
  else
    raw = redis.pcall('GET', key)
    if wrong_type(raw) then
      conflict(key)
    end
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

-- A decision that would write a string state carries the write in its
-- reply's array, after the six fields: r[7] the key, r[8] the tag, r[9] the
-- value, r[10] the reset (write_state's arguments), rather than in a
-- closure, which with its upvalues costs Redis about 4 % of a decision
-- (callgrind). Sorted-set states keep a closure, r.commit. commit applies
-- either and clears r[7..10]: Redis replies with the array up to its first
-- nil, so a committed reply is the six fields again.
local function commit(r)
  if r[7] then
    write_state(r[7], r[8], r[9], r[10])
    r[7], r[8], r[9], r[10] = nil, nil, nil, nil
  elseif r.commit then
    r.commit()
  end
end

-- Whether `r` writes when committed.
local function writes(r)
  return r[7] ~= nil or r.commit ~= nil
end
