-- GCRA: bursts up to `burst`, one unit every `interval`, kept in one
-- timestamp (see tat_decision, tat.lua).
ALGORITHMS['gcra'] = tat_decision(false)
