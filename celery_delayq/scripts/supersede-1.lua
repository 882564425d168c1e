--[[ supersede: remove a job id's dead letter of an earlier call, which a letter written
since on another shard replaces (one dead letter per job id), unless it changed meanwhile.

KEYS[1] dead      HASH  job id -> {"reason", "envelope", "at"} (JSON)

ARGV[1] job id
ARGV[2] the SHA-1 (hex) of its dead letter as read before the new one was written

Returns 1 when removed, 0 when that letter is no longer there (gone, or written again by a
later call of the id, which stays).

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when its key
holds the wrong type of value.
]]
-- include: damaged.lua
local problem = damaged({1, 'hash'})
if problem then return redis.error_reply(problem) end
local letter = redis.call('HGET', KEYS[1], ARGV[1])
if not letter or redis.sha1hex(letter) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
