--[[ reschedule: give a pending job a new due time (run_now is a delay of 0), and its task
id index (keys.py) the expiry of that due time.

KEYS[1] due       ZSET  job id -> due ms
KEYS[2] jobs      HASH  job id -> envelope
KEYS[3] journal   STREAM
KEYS[4] task      STRING  the task id index key of ARGV[7], given when ARGV[7] is not ""

ARGV[1] journal maxlen (0: no journal)
ARGV[2] job id
ARGV[3] absolute due time in ms, or "" to use ARGV[4]
ARGV[4] delay in ms from Redis's clock (TIME) when ARGV[3] is ""
ARGV[5] wake channel
ARGV[6] shard number
ARGV[7] the job's task id when it is not its job id, else "": the caller's guess, checked
ARGV[8] ms the index outlives the job's due time

The index expires ARGV[8] ms after the new due time, while it names this job; an index
naming another job (one given that task id since), or holding another type of value
(damaged), is left alone.

Returns {1, new due ms, task id} when rescheduled, {0, -1, ""} when the job is not pending
(already claimed or promoted, cancelled, or unknown), {-1, -1, task id} when ARGV[7] is not
the job's task id: nothing written, call again with that one (and its index key). A task
id is "" when it is the job id.

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: damaged.lua
-- include: first_line.lua
-- include: journal.lua
-- include: now.lua
local problem = damaged({1, 'zset', 2, 'hash', 3, 'stream'})
if problem then return redis.error_reply(problem) end
local job_id = ARGV[2]
if not redis.call('ZSCORE', KEYS[1], job_id) then return {0, -1, ''} end
local fields = first_line(redis.call('HGET', KEYS[2], job_id))
local task_id = text_field(fields, 'i')
if task_id ~= ARGV[7] then return {-1, -1, task_id} end
local indexed = task_id ~= '' and redis.call('TYPE', KEYS[4]).ok == 'string'
  and redis.call('GET', KEYS[4]) == job_id
local now = now_ms()
local due = now + tonumber(ARGV[4])
if ARGV[3] ~= '' then due = tonumber(ARGV[3]) end
if indexed then  -- first: a user without PEXPIRE (an older ACL line) is refused unwritten
  redis.call('PEXPIRE', KEYS[4], math.max(due - now, 0) + tonumber(ARGV[8]))
end
redis.call('ZADD', KEYS[1], 'XX', due, job_id)
journal(3, 'rescheduled', 'job', job_id, 'task', text_field(fields, 't'), 'key',
        text_field(fields, 'y'), 'due', due)
local head = redis.call('ZRANGE', KEYS[1], 0, 0)
if head[1] == job_id then redis.call('PUBLISH', ARGV[5], ARGV[6]) end
return {1, due, task_id}
