-- When this region's Redis last heard from each peer (merge.lua writes it).
--
-- KEYS[i]  `<prefix>:mr:heard:<peer>`
-- Returns the server's TIME in µs, then for each peer the time it was last
-- heard from, or -1 when never (or so long ago that its key expired).
local t = redis.call('TIME')
local reply = {string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))}
for i = 1, #KEYS do
  reply[#reply + 1] = redis.call('GET', KEYS[i]) or '-1'
end
return reply
