-- Integer arithmetic every script shares (the rate-limit scripts through the
-- prelude, the multi-region ones directly). Lua numbers are doubles, exact
-- for integers below 2^53:
--   * `a / b` can round up across an integer, so integer division goes
--     through `idiv`, which corrects the quotient;
--   * numbers passed to redis.call are turned into strings with 14 digits,
--     so every number sent to Redis goes through `fmt` first.
-- (q - q % 1 is math.floor(q), exactly, without looking up and calling a
-- function: the VM's own modulo.)
local function idiv(a, b)
  local q = a / b
  q = q - q % 1
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
