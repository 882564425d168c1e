--[[ recover: return jobs whose lease expired (their carrier died) to the due set.

KEYS[1] inflight  ZSET  job id -> lease deadline ms
KEYS[2] due       ZSET  job id -> due ms
KEYS[3] journal   STREAM
KEYS[4] jobs      HASH  job id -> envelope (for the task name in the journal)

ARGV[1] batch size
ARGV[2] journal maxlen (0: no journal)

A recovered job is due now; a job scheduled again while in flight keeps its new due time.
Returns the number of jobs recovered.
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[1])
local maxlen = tonumber(ARGV[2])
for _, job_id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], job_id)
  redis.call('ZADD', KEYS[2], 'NX', now, job_id)
  if maxlen > 0 then
    local ok, decoded = pcall(cjson.decode, redis.call('HGET', KEYS[4], job_id) or '')
    local task = ok and type(decoded) == 'table' and decoded['t'] or ''
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', maxlen, '*', 'event', 'recovered',
               'job', job_id, 'task', task, 'due', now)
  end
end
return #ids
