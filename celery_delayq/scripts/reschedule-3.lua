--[[ reschedule: give a pending job a new due time (run_now is a delay of 0).

KEYS[1] due       ZSET  job id -> due ms
KEYS[2] jobs      HASH  job id -> envelope
KEYS[3] journal   STREAM

ARGV[1] job id
ARGV[2] absolute due time in ms, or "" to use ARGV[3]
ARGV[3] delay in ms from Redis's clock (TIME) when ARGV[2] is ""
ARGV[4] wake channel
ARGV[5] shard number
ARGV[6] journal maxlen (0: no journal)

Returns {1, new due ms, task id} when rescheduled (the task id when it is not the job id,
else ""), {0, -1, ""} when the job is not pending (already claimed or promoted, cancelled,
or unknown).

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: damaged.lua
local problem = damaged({1, 'zset', 2, 'hash', 3, 'stream'})
if problem then return redis.error_reply(problem) end
local job_id = ARGV[1]
if not redis.call('ZSCORE', KEYS[1], job_id) then return {0, -1, ''} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = now + tonumber(ARGV[3])
if ARGV[2] ~= '' then due = tonumber(ARGV[2]) end
redis.call('ZADD', KEYS[1], 'XX', due, job_id)
local task, key, task_id = '', '', ''
local ok, decoded = pcall(cjson.decode, string.match(
    redis.call('HGET', KEYS[2], job_id) or '', '^[^\n]*'))
if ok and type(decoded) == 'table' then
  task = decoded['t'] or ''
  key = decoded['y'] or ''
  if type(decoded['i']) == 'string' then task_id = decoded['i'] end
end
if tonumber(ARGV[6]) > 0 then
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*', 'event', 'rescheduled',
             'job', job_id, 'task', task, 'key', key, 'due', due)
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0)
if head[1] == job_id then redis.call('PUBLISH', ARGV[4], ARGV[5]) end
return {1, due, task_id}
