--[[ ack: a carrier published these claimed jobs; forget them and journal "promoted".

KEYS[1] inflight  ZSET  job id -> lease deadline ms
KEYS[2] jobs      HASH  job id -> envelope, and kept(job id) (kept.lua): goes with the lease
KEYS[3] due       ZSET  job id -> due ms
KEYS[4] bykey     ZSET  business-key index
KEYS[5] journal   STREAM
KEYS[6] counts    HASH  task name -> jobs stored (pending or being promoted)
KEYS[7..] task    STRING  the task id index key (keys.py) of each job whose task id is not
                  its job id, in the order of those jobs

ARGV[1] journal maxlen (0: no journal)
ARGV[2..] seven values per job: job id, bykey member or "", task name, business key or "",
          due ms, the lease claim_due gave it ("": whatever holds it), the KEYS index of
          its task id index key (0: none)

A job that was scheduled again (same id) while it was in flight keeps its new envelope,
and a lease that is no longer this one (the id claimed again) is left alone. The envelope
an ack removes is the claimed copy's (a cancel of a replacement put it back), counted down
under its task. A job that leaves the shard takes its task id index with it (while it
names that job): only a pending job is found by its task id. A job whose lease is not
this one and that has left the shard altogether
(no lease, not pending, no envelope) is not journaled again: that is an ack redis-py sent
a second time after its reply was lost, and its first run journaled it.
Returns the number of jobs acknowledged.

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: counts.lua
-- include: damaged.lua
-- include: journal.lua
-- include: kept.lua
local problem = damaged({1, 'zset', 2, 'hash', 3, 'zset', 4, 'zset', 5, 'stream', 6, 'hash'})
if problem then return redis.error_reply(problem) end
local n = 0
local per_task = {}  -- task name -> jobs forgotten, counted down once per call
for i = 2, #ARGV, 7 do
  local job_id, task = ARGV[i], ARGV[i + 2]
  local held = redis.call('ZSCORE', KEYS[1], job_id)
  local ours = ARGV[i + 5] == '' or (held and tonumber(held) == tonumber(ARGV[i + 5]))
  if ours then redis.call('ZREM', KEYS[1], job_id) end
  if ours and redis.call('ZSCORE', KEYS[3], job_id) then
    redis.call('HDEL', KEYS[2], kept(job_id))  -- the copy scheduled again stays
  elseif ours then
    if redis.call('HDEL', KEYS[2], job_id) == 1 then
      per_task[task] = (per_task[task] or 0) + 1
    else
      redis.call('HDEL', KEYS[2], kept(job_id))  -- moved to another shard meanwhile
    end
    if ARGV[i + 1] ~= '' then redis.call('ZREM', KEYS[4], ARGV[i + 1]) end
    local at = tonumber(ARGV[i + 6])
    if at > 0 and redis.call('GET', KEYS[at]) == job_id then redis.call('DEL', KEYS[at]) end
  end
  local gone = not ours and not held and not redis.call('ZSCORE', KEYS[3], job_id)
    and redis.call('HEXISTS', KEYS[2], job_id) == 0
  if not gone then
    journal_batch(5, 'promoted', 'job', job_id, 'task', task, 'key', ARGV[i + 3],
                  'due', ARGV[i + 4])
  end
  n = n + 1
end
for name, forgotten in pairs(per_task) do add_count(6, name, -forgotten) end
trim_journal(5)
return n
