-- GCRA: bursts up to `burst`, one unit every `interval`, kept in one
-- timestamp (see decide_tat in the prelude).
ALGORITHMS['gcra'] = function(key, now, cost, burst, interval)
  return decide_tat(key, now, cost, burst, interval, false)
end
