-- Leaky bucket as a queue: admitted requests leave one `interval` apart, at
-- most `capacity` units in the bucket. Same admission as GCRA; every allowed
-- decision also says how long to wait for its slot.
ALGORITHMS['leaky-bucket'] = function(key, now, cost, capacity, interval)
  return decide_tat(key, now, cost, capacity, interval, true)
end
