-- The shared transition of GCRA and the leaky bucket. State (string, tag
-- TAG.tat): the theoretical arrival time.
local TAT_BYTE = 103 -- string.byte(TAG.tat): loading has no string library
local TAT_STATE = 'g%d'

-- The decision of GCRA (with_delay false) or of the leaky bucket (true):
-- one closure each, so that a decision is one Lua call and not two.
local function tat_decision(with_delay)
  return function(call, key, now, cost, capacity, interval)
    local tat = 0
    local raw = tagged_state(call, key, TAT_BYTE)
    if raw then
      if string.byte(raw) == TAT_BYTE then
        raw = string.sub(raw, 2)
      end
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
      return 0, capacity, idiv(positive(span - reset), interval), reset, new_tat - now - span, 0
    end
    if cost > 0 then
      tat = new_tat
    end
    local reset = positive(tat - now)
    local delay = 0
    if with_delay then
      delay = slot - now
    end
    local remaining = idiv(span - reset, interval)
    if cost > 0 then
      return 1, capacity, remaining, reset, 0, delay, key, false, string.format(TAT_STATE, tat), reset
    end
    return 1, capacity, remaining, reset, 0, delay
  end
end
