-- Leaky bucket as a queue: admitted requests leave one `interval` apart, at
-- most `capacity` units in the bucket. Same admission as GCRA; every allowed
-- decision also says how long to wait for its slot.
ALGORITHMS['leaky-bucket'] = tat_decision(true)
