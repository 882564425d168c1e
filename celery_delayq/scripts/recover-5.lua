--[[ recover: return claimed jobs to the due set: those whose lease expired (their carrier
died), or the given ones (their carrier could not publish them).

KEYS[1] inflight  ZSET  job id -> lease deadline ms
KEYS[2] due       ZSET  job id -> due ms
KEYS[3] journal   STREAM
KEYS[4] jobs      HASH  job id -> envelope (for the task name in the journal); a lease that
                        ends takes its kept(job id) field (kept.lua)
KEYS[5] bykey     ZSET  business-key index: a recovered job with a key gets its member back
                        (a cancel of its pending copy while it was in flight removed it)

ARGV[1] journal maxlen (0: no journal)
ARGV[2] batch size
ARGV[3] the lease claim_due gave the jobs of ARGV[4..] (absent: return the expired ones)
ARGV[4..] job ids to return now whatever their deadline, if that lease still holds them

A recovered job is due now; a job scheduled again while in flight keeps its new due time;
a job without an envelope (moved to another shard while in flight) only loses its lease.
Returns the number of jobs returned to the due set.

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: damaged.lua
-- include: first_line.lua
-- include: journal.lua
-- include: kept.lua
-- include: now.lua
local problem = damaged({1, 'zset', 2, 'zset', 3, 'stream', 4, 'hash', 5, 'zset'})
if problem then return redis.error_reply(problem) end
local now = now_ms()
local ids, lease = {}, tonumber(ARGV[3])
for i = 4, #ARGV do ids[#ids + 1] = ARGV[i] end
if not lease then
  ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[2])
end
local recovered = 0
for _, job_id in ipairs(ids) do
  local held = lease and tonumber(redis.call('ZSCORE', KEYS[1], job_id) or nil)
  local env = nil
  if (not lease or held == lease) and redis.call('ZREM', KEYS[1], job_id) == 1 then
    env = redis.call('HGET', KEYS[4], job_id)
    redis.call('HDEL', KEYS[4], kept(job_id))
  end
  if env then  -- none: the job moved to another shard while in flight; its lease just ends
    recovered = recovered + 1
    redis.call('ZADD', KEYS[2], 'NX', now, job_id)
    local fields = first_line(env)
    local key = text_field(fields, 'y')
    if key ~= '' then redis.call('ZADD', KEYS[5], 0, key .. '\0' .. job_id) end
    journal(3, 'recovered', 'job', job_id, 'task', text_field(fields, 't'), 'due', now)
  end
end
return recovered
