-- One decision. KEYS[1]: the state key, KEYS[2]: its block key. ARGV: fixed
-- time (0 = server TIME), cost, two policy parameters, permit id
-- (concurrency only).
-- Reply: {allowed, limit, remaining, reset_after, retry_after, delay} in µs.
local function run_single(decide)
  local now = server_now()
  local r = decide_unless_blocked(decide, KEYS[1], KEYS[2], now, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5])
  if r[1] == 1 and r.commit then
    r.commit()
  end
  return {r[1], r[2], r[3], r[4], r[5], r[6]}
end
