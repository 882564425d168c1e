--[[ replay: put a dead-lettered job back on the due set, due now.

KEYS[1] dead      HASH  job id -> {"reason", "envelope", "at"} (JSON)
KEYS[2] jobs      HASH  job id -> envelope
KEYS[3] due       ZSET  job id -> due ms
KEYS[4] bykey     ZSET  business-key index
KEYS[5] journal   STREAM
KEYS[6] counts    HASH  task name -> jobs stored (pending or being promoted)

ARGV[1] job id
ARGV[2] envelope to store instead of the dead one, or "" to keep it
ARGV[3] journal maxlen (0: no journal)
ARGV[4] wake channel
ARGV[5] shard number

Returns 1 when replayed, 0 when no dead job has this id, -1 when a live job has it.

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: damaged.lua
local problem = damaged({1, 'hash', 2, 'hash', 3, 'zset', 4, 'zset', 5, 'stream', 6, 'hash'})
if problem then return redis.error_reply(problem) end
local job_id = ARGV[1]
local dead = redis.call('HGET', KEYS[1], job_id)
if not dead then return 0 end
if redis.call('HEXISTS', KEYS[2], job_id) == 1 then return -1 end
local env = ARGV[2]
if env == '' then env = cjson.decode(dead)['envelope'] end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[2], job_id, env)
redis.call('ZADD', KEYS[3], now, job_id)
redis.call('HDEL', KEYS[1], job_id)
local task = ''
local ok, decoded = pcall(cjson.decode, string.match(env, '^[^\n]*'))
if ok and type(decoded) == 'table' then
  if type(decoded['y']) == 'string' then
    redis.call('ZADD', KEYS[4], 0, decoded['y'] .. '\0' .. job_id)
  end
  if type(decoded['t']) == 'string' then
    task = decoded['t']
    redis.call('HINCRBY', KEYS[6], task, 1)
  end
end
if tonumber(ARGV[3]) > 0 then
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[3], '*', 'event', 'replayed',
             'job', job_id, 'task', task, 'due', now)
end
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
