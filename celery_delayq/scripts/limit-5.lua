--[[ limit: set or remove the promotion rate limit of a queue on one shard (ratelimit.py).

KEYS[1] limits    HASH  "rate:<queue>" -> "<capacity> <refill per ms> <spec>" or "off",
                        "bucket:<queue>" -> "<tokens> <ms>"
KEYS[2] due       ZSET  job id -> due ms (held jobs: a base + due ms, see held.py)
KEYS[3] jobs      HASH  job id -> envelope
KEYS[4] journal   STREAM
KEYS[5] waiting   ZSET  "<queue>\0<due>\0<job id>": the jobs rate limits hold (claim_due)

ARGV[1] journal maxlen (0: not journaled on this shard; the store journals on shard 0)
ARGV[2] the queue
ARGV[3] its limit, "<capacity> <refill per ms> <spec>", or "off" to remove it
ARGV[4] who did it (journaled)
ARGV[5] the default queue (of envelopes that name none)
ARGV[6] wake channel
ARGV[7] shard number

A new or changed limit applies from the next claim (a bucket keeps its tokens, up to the
new capacity). Removing it gives every job of the queue the limit held its due time back
(then due, the carrier promotes it oldest first) and drops its waiting members. Returns the
number of jobs given back.

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: damaged.lua
-- include: held.lua
-- include: journal.lua
local problem = damaged({1, 'hash', 2, 'zset', 3, 'hash', 4, 'stream', 5, 'zset'})
if problem then return redis.error_reply(problem) end
local queue, limit = ARGV[2], ARGV[3]
journal(4, 'rate_limit', 'queue', queue, 'rate', string.match(limit, '(%S+)$'), 'by', ARGV[4])
redis.call('HSET', KEYS[1], 'rate:' .. queue, limit)
if limit ~= 'off' then return 0 end
redis.call('HDEL', KEYS[1], 'bucket:' .. queue)
redis.call('ZREMRANGEBYLEX', KEYS[5], '[' .. queue .. '\0', '(' .. queue .. '\1')
local held = redis.call('ZRANGEBYSCORE', KEYS[2], RATE_BASE + MIN_DUE, RATE_BASE + MAX_DUE,
                       'WITHSCORES')
local released = 0
for i = 1, #held, 2 do
  local job_id = held[i]
  local _, its_queue = first_fields(redis.call('HGET', KEYS[3], job_id), ARGV[5])
  if its_queue == queue or its_queue == nil then
    redis.call('ZADD', KEYS[2], tonumber(held[i + 1]) - RATE_BASE, job_id)
    released = released + 1
  end
end
if released > 0 then redis.call('PUBLISH', ARGV[6], ARGV[7]) end
return released
