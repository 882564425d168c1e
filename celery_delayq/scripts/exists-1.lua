--[[ exists: which of these job ids a shard holds (pending, being promoted), in one call.

KEYS[1] jobs      HASH  job id -> envelope

ARGV[1]   a job id (ARGV[2..]: more job ids)

Returns a string with one character per id, in order: "1" when the shard holds it, else "0".
]]
local found = {}
for i = 1, #ARGV do
  found[i] = redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 and '1' or '0'
end
return table.concat(found)
