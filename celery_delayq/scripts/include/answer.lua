-- A call whose reply was lost (a dropped connection, a reply later than the client's
-- timeout) is sent again by redis-py and runs again. A script whose second run would
-- answer otherwise keeps its reply in a key of the call's own (keys.answer), ANSWER_MS
-- long: answered(n) is that reply when KEYS[n] holds one, answer(n, reply) keeps reply
-- there and returns it.
local ANSWER_MS = 60000
local function answered(n)
  local kept = redis.call('GET', KEYS[n])
  if kept then return cjson.decode(kept) end
end
local function answer(n, reply)
  redis.call('SET', KEYS[n], cjson.encode(reply), 'PX', ANSWER_MS)
  return reply
end
