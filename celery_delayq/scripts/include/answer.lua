-- A call whose reply was lost (a dropped connection, a reply later than the client's
-- timeout) is sent again by redis-py and runs again. A script whose second run would
-- answer otherwise keeps its reply in a key of the call's own (keys.answer), ANSWER_MS
-- long: answered(n) is that reply when KEYS[n] holds one; answer(n, reply, wrote) keeps
-- reply there when the call wrote something, and returns it. A call that wrote nothing
-- keeps nothing: run again it answers the same, and on a full Redis (maxmemory) only a
-- script that has written already may go on writing.
local ANSWER_MS = 60000
local function answered(n)
  local kept = redis.call('GET', KEYS[n])
  if kept then return cjson.decode(kept) end
end
local function answer(n, reply, wrote)
  if wrote then redis.call('SET', KEYS[n], cjson.encode(reply), 'PX', ANSWER_MS) end
  return reply
end
