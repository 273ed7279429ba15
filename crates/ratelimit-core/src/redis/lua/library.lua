-- The Redis Functions library (Redis 7 and later): the prelude, every helper
-- and every algorithm are defined once, when the library is loaded (FUNCTION
-- LOAD), instead of on every call as in a script; FCALL then runs only the
-- decision. One function per algorithm, FUNCTION_PREFIX .. <algorithm> (with
-- '_' for '-': function names are letters, digits and '_'), with
-- the keys and arguments of single.lua (and FUNCTION_PREFIX .. 'text_' ..
-- <algorithm>, the same with its reply as one line of text, see single.lua),
-- and FUNCTION_PREFIX .. 'batch', with
-- those of batch.lua (several requests in one call). Every key a function
-- touches is one of its declared keys. The store prepends the library's name
-- and FUNCTION_PREFIX, both made of the library's own SHA-1, so that stores of
-- different versions sharing a Redis never replace each other's functions.
-- (Loading runs in a narrow environment: no pairs, hence the list.)
-- The library's `number` (see the prelude) is tonumber, called inside a
-- function: loading runs without the global library. The library keeps no
-- state between calls: every client of this Redis shares it.
number = function(s)
  return tonumber(s)
end

local FUNCTIONS = {
  {'fixed_window', 'fixed-window'}, {'sliding_log', 'sliding-log'},
  {'sliding_window', 'sliding-window'}, {'token_bucket', 'token-bucket'},
  {'gcra', 'gcra'}, {'leaky_bucket', 'leaky-bucket'}, {'concurrency', 'concurrency'},
}
for i = 1, #FUNCTIONS do
  local decide = ALGORITHMS[FUNCTIONS[i][2]]
  redis.register_function(FUNCTION_PREFIX .. FUNCTIONS[i][1], function(keys, args)
    return run_single(decide, keys, args)
  end)
  redis.register_function(FUNCTION_PREFIX .. 'text_' .. FUNCTIONS[i][1], function(keys, args)
    return run_single(decide, keys, args, true)
  end)
end
redis.register_function(FUNCTION_PREFIX .. 'batch', function(keys, args)
  return run_batch(keys, args)
end)
