--[[ dead: a carrier cannot publish a claimed job; keep it in the dead-letter hash.

KEYS[1] inflight  ZSET  job id -> lease deadline ms
KEYS[2] jobs      HASH  job id -> envelope
KEYS[3] dead      HASH  job id -> {"reason", "envelope", "at"} (JSON)
KEYS[4] bykey     ZSET  business-key index
KEYS[5] journal   STREAM
KEYS[6] counts    HASH  task name -> jobs stored (pending or being promoted)

ARGV[1] job id
ARGV[2] reason
ARGV[3] bykey member or "" (then the envelope's business key, if it has one)
ARGV[4] journal maxlen (0: no journal)

Returns 1 when the job was dead-lettered, 0 when this carrier no longer held it.

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: damaged.lua
local problem = damaged({1, 'zset', 2, 'hash', 3, 'hash', 4, 'zset', 5, 'stream', 6, 'hash'})
if problem then return redis.error_reply(problem) end
local job_id = ARGV[1]
if redis.call('ZREM', KEYS[1], job_id) == 0 then return 0 end
local t = redis.call('TIME')
local env = redis.call('HGET', KEYS[2], job_id)
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
