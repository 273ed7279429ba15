-- The state-hash helpers the multi-region scripts share (prepended to each,
-- after the integer helpers of redis/lua/numbers.lua).

-- A field of a state hash: `<region>:<start>:<window>`, a count admitted by
-- (for this region) or heard from (for a peer) `region` in the window of
-- length `window` that starts at `start`; or `<region>@<epoch>:<start>:<window>`,
-- the cumulative count of a peer's own window as last heard (kind 'seen');
-- or `<region>:<start>`, a count of a window of `default_window` (written
-- before fields named their window). Returns kind, region, start, window,
-- epoch; nil for anything else.
local function parse_field(name, default_window)
  local region, epoch, start, window = string.match(name, '^([%w._-]+)@(%d+):(%d+):(%d+)$')
  if region then
    return 'seen', region, tonumber(start), tonumber(window), epoch
  end
  region, start, window = string.match(name, '^([%w._-]+):(%d+):(%d+)$')
  if region then
    return 'count', region, tonumber(start), tonumber(window)
  end
  region, start = string.match(name, '^([%w._-]+):(%d+)$')
  if region then
    return 'count', region, tonumber(start), default_window
  end
  return nil
end

-- Extends the TTL of `key` (which exists) to at least `ms` milliseconds;
-- never shortens it.
local function extend_ttl(key, ms)
  local left = redis.call('PTTL', key)
  if left == -1 or (left >= 0 and left < ms) then
    redis.call('PEXPIRE', key, fmt(ms))
  end
end

-- The TTL in milliseconds that keeps a key a little beyond `until_us`, and
-- an hour more on a fixed test clock (`fixed`), which real time does not
-- move.
local function ttl_ms(until_us, now, fixed)
  local ms = idiv(until_us - now + 999, 1000) + 1000
  if fixed then
    ms = ms + 3600000
  end
  return ms
end
