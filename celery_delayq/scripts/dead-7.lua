--[[ dead: a carrier cannot publish a claimed job; keep it in the dead-letter hash.

KEYS[1] inflight  ZSET  job id -> lease deadline ms
KEYS[2] jobs      HASH  job id -> envelope
KEYS[3] dead      HASH  job id -> {"reason", "envelope", "at"} (JSON)
KEYS[4] bykey     ZSET  business-key index
KEYS[5] journal   STREAM
KEYS[6] counts    HASH  task name -> jobs stored (pending or being promoted)
KEYS[7] due       ZSET  job id -> due ms

ARGV[1] job id
ARGV[2] reason
ARGV[3] bykey member or "" (then the envelope's business key, if it has one)
ARGV[4] journal maxlen (0: no journal)
ARGV[5] the lease claim_due gave the job ("": whatever holds it)
ARGV[6] "1" when claim_due read an envelope for it, else "" (none was stored)

Returns 1 when the job was dead-lettered, 0 when this lease no longer held it. A job
scheduled again while in flight (pending again, or moved to another shard: no envelope
here) only loses the lease: the new copy stays.

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: damaged.lua
local problem = damaged({1, 'zset', 2, 'hash', 3, 'hash', 4, 'zset', 5, 'stream', 6, 'hash',
                         7, 'zset'})
if problem then return redis.error_reply(problem) end
local job_id = ARGV[1]
local held = redis.call('ZSCORE', KEYS[1], job_id)
if not held or (ARGV[5] ~= '' and tonumber(held) ~= tonumber(ARGV[5])) then return 0 end
redis.call('ZREM', KEYS[1], job_id)
if redis.call('ZSCORE', KEYS[7], job_id) then return 1 end  -- superseded by a new copy
local env = redis.call('HGET', KEYS[2], job_id)
if not env and ARGV[6] == '1' then return 1 end  -- moved to another shard since: superseded
local t = redis.call('TIME')
redis.call('HSET', KEYS[3], job_id, cjson.encode({
  reason = ARGV[2], envelope = env or '', at = tonumber(t[1]) * 1000 + math.floor(t[2] / 1000)}))
redis.call('HDEL', KEYS[2], job_id)
local task, member = '', ARGV[3]
local ok, decoded = pcall(cjson.decode, string.match(env or '', '^[^\n]*'))
if ok and type(decoded) == 'table' then
  if type(decoded['t']) == 'string' then
    task = decoded['t']
    redis.call('HINCRBY', KEYS[6], task, -1)
  end
  if member == '' and type(decoded['y']) == 'string' then
    member = decoded['y'] .. '\0' .. job_id
  end
end
if member ~= '' then redis.call('ZREM', KEYS[4], member) end
if tonumber(ARGV[4]) > 0 then
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[4], '*', 'event', 'dead',
             'job', job_id, 'task', task, 'reason', ARGV[2])
end
return 1
