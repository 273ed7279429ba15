-- The start of a script run by EVALSHA (or EVAL): its `number` (see the
-- prelude), and, before Redis 7, effects replication (TIME makes a script
-- non-deterministic). Each entry point then makes its call's context
-- (new_call, in the prelude).
if redis.replicate_commands then
  redis.replicate_commands()
end
number = tonumber
