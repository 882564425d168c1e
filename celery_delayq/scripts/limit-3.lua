--[[ limit: set or remove the promotion rate limit of a queue on one shard (ratelimit.py).

KEYS[1] limits    HASH  "rate:<queue>" -> "<capacity> <refill per ms> <spec>" or "off",
                        "bucket:<queue>" -> "<tokens> <ms>"
KEYS[2] journal   STREAM
KEYS[3] releasing HASH  the releases under way (include/releasing.lua)

ARGV[1] journal maxlen (0: not journaled on this shard; the store journals on shard 0)
ARGV[2] the queue
ARGV[3] its limit, "<capacity> <refill per ms> <spec>", or "off" to remove it
ARGV[4] who did it (journaled)
ARGV[5] the removal's token (unique per call; unused when a limit is set)

A new or changed limit applies from the next claim (a bucket keeps its tokens, up to the
new capacity). Removing it also drops the bucket and begins a release: the store then
gives back the jobs the limit held (release-6.lua, call by call), and a carrier finishes
it if the store stops part way. Returns 0.

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: damaged.lua
-- include: journal.lua
-- include: releasing.lua
local problem = damaged({1, 'hash', 2, 'stream', 3, 'hash'})
if problem then return redis.error_reply(problem) end
local queue, limit = ARGV[2], ARGV[3]
journal(2, 'rate_limit', 'queue', queue, 'rate', string.match(limit, '(%S+)$'), 'by', ARGV[4])
-- writes that need memory first: a full Redis refuses the call before it changes anything
if limit == 'off' then note_release(3, 'rate:' .. queue, ARGV[5], '') end
redis.call('HSET', KEYS[1], 'rate:' .. queue, limit)
if limit == 'off' then redis.call('HDEL', KEYS[1], 'bucket:' .. queue) end
return 0
