--[[ pause: pause or resume a task or a queue on one shard (pausing.py).

KEYS[1] paused    HASH  "task:<name>" / "queue:<name>" -> who paused it (JSON: by, at ms)
KEYS[2] due       ZSET  job id -> due ms (held jobs: a base + due ms, see held.py)
KEYS[3] jobs      HASH  job id -> envelope
KEYS[4] journal   STREAM

ARGV[1] journal maxlen (0: not journaled on this shard; the store journals on shard 0)
ARGV[2] "pause" or "resume"
ARGV[3] the paused hash field
ARGV[4] who did it (journaled)
ARGV[5] the default queue (of envelopes that name none)
ARGV[6] wake channel
ARGV[7] shard number

Pause marks the field; the claim script holds each job of it as it falls due. Resume
unmarks it and gives every paused job that no pause holds any more its due time back
(then due, the carrier promotes it oldest first), publishing the shard on the wake
channel. Returns the number of jobs given back (0 for pause).

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: damaged.lua
-- include: held.lua
-- include: journal.lua
-- include: now.lua
local problem = damaged({1, 'hash', 2, 'zset', 3, 'hash', 4, 'stream'})
if problem then return redis.error_reply(problem) end
local now = now_ms()
local action, field, by = ARGV[2], ARGV[3], ARGV[4]
local kind, name = string.match(field, '^(%a+):(.*)$')
journal(4, action == 'pause' and 'paused' or 'resumed', kind, name, 'by', by)
if action == 'pause' then
  redis.call('HSET', KEYS[1], field, cjson.encode({by = by, at = now}))
  return 0
end
redis.call('HDEL', KEYS[1], field)
local paused = {}
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do paused[flat[i]] = true end
local held = redis.call('ZRANGEBYSCORE', KEYS[2], PAUSED_BASE + MIN_DUE,
                       PAUSED_BASE + MAX_DUE, 'WITHSCORES')
local released = 0
for i = 1, #held, 2 do
  local job_id = held[i]
  local task, queue = first_fields(redis.call('HGET', KEYS[3], job_id), ARGV[5])
  if not (task and held_by(paused, task, queue)) then
    redis.call('ZADD', KEYS[2], tonumber(held[i + 1]) - PAUSED_BASE, job_id)
    released = released + 1
  end
end
if released > 0 then redis.call('PUBLISH', ARGV[6], ARGV[7]) end
return released
