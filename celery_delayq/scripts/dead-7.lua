--[[ dead: a carrier cannot publish a claimed job; keep it in the dead-letter hash.

KEYS[1] inflight  ZSET  job id -> lease deadline ms
KEYS[2] jobs      HASH  job id -> envelope, and kept(job id) (kept.lua): goes with the lease
KEYS[3] dead      HASH  job id -> {"reason", "envelope", "at"} (JSON)
KEYS[4] bykey     ZSET  business-key index
KEYS[5] journal   STREAM
KEYS[6] counts    HASH  task name -> jobs stored (pending or being promoted)
KEYS[7] due       ZSET  job id -> due ms

ARGV[1] journal maxlen (0: no journal)
ARGV[2] job id
ARGV[3] reason
ARGV[4] bykey member or "" (then the envelope's business key, if it has one)
ARGV[5] the lease claim_due gave the job ("": whatever holds it)
ARGV[6] "1" when claim_due read an envelope for it, else "" (none was stored)

Returns 1 when the job was dead-lettered, 0 when this lease no longer held it, 2 when a
job scheduled again while in flight (pending again, or moved to another shard: no envelope
here) superseded it: the claim only loses its lease, the new copy stays.

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: counts.lua
-- include: damaged.lua
-- include: first_line.lua
-- include: journal.lua
-- include: kept.lua
-- include: now.lua
local problem = damaged({1, 'zset', 2, 'hash', 3, 'hash', 4, 'zset', 5, 'stream', 6, 'hash',
                         7, 'zset'})
if problem then return redis.error_reply(problem) end
local job_id, reason = ARGV[2], ARGV[3]
local held = redis.call('ZSCORE', KEYS[1], job_id)
if not held or (ARGV[5] ~= '' and tonumber(held) ~= tonumber(ARGV[5])) then return 0 end
redis.call('ZREM', KEYS[1], job_id)
redis.call('HDEL', KEYS[2], kept(job_id))
if redis.call('ZSCORE', KEYS[7], job_id) then return 2 end  -- superseded by a new copy
local env = redis.call('HGET', KEYS[2], job_id)
if not env and ARGV[6] == '1' then return 2 end  -- moved to another shard since
redis.call('HSET', KEYS[3], job_id, cjson.encode({
  reason = reason, envelope = env or '', at = now_ms()}))
redis.call('HDEL', KEYS[2], job_id)
local task, member = '', ARGV[4]
local fields = first_line(env)
if fields then
  if type(fields['t']) == 'string' then
    task = fields['t']
    add_count(6, task, -1)
  end
  if member == '' and type(fields['y']) == 'string' then
    member = fields['y'] .. '\0' .. job_id
  end
end
if member ~= '' then redis.call('ZREM', KEYS[4], member) end
journal(5, 'dead', 'job', job_id, 'task', task, 'reason', reason)
return 1
