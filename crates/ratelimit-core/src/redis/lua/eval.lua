-- The start of a script run by EVALSHA (or EVAL): its time, its `number`
-- (see the prelude), and, before Redis 7, effects replication (TIME makes a
-- script non-deterministic).
if redis.replicate_commands then
  redis.replicate_commands()
end
FIXED_NOW = tonumber(ARGV[1]) or 0
number = tonumber
