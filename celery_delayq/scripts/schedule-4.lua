--[[ schedule: store one job and put it on the due set.

KEYS[1] due       ZSET  job id -> due ms
KEYS[2] jobs      HASH  job id -> envelope
KEYS[3] bykey     ZSET  business-key index
KEYS[4] journal   STREAM

ARGV[1] job id
ARGV[2] envelope (JSON text)
ARGV[3] absolute due time in ms, or "" to use ARGV[4]
ARGV[4] delay in ms, added to Redis's own clock (TIME) when ARGV[3] is ""
ARGV[5] if_exists: "keep" | "replace" | "error"
ARGV[6] bykey member ("<key>\0<job id>") or ""
ARGV[7] wake channel
ARGV[8] shard number (published on the wake channel)
ARGV[9] journal maxlen (0: no journal)
ARGV[10] task name (journal)
ARGV[11] business key or "" (journal)

Returns {code, due ms, existing envelope or nil}:
   1 scheduled    2 replaced an existing job
   0 kept the existing job (if_exists=keep)    -1 exists (if_exists=error)
]]
local job_id = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = now + tonumber(ARGV[4])
if ARGV[3] ~= '' then due = tonumber(ARGV[3]) end

local old = redis.call('HGET', KEYS[2], job_id)
local code = 1
if old then
  if ARGV[5] ~= 'replace' then
    local old_due = redis.call('ZSCORE', KEYS[1], job_id) or -1
    return {ARGV[5] == 'keep' and 0 or -1, tonumber(old_due), old}
  end
  code = 2
  local ok, decoded = pcall(cjson.decode, old)
  if ok and type(decoded) == 'table' and type(decoded['y']) == 'string' then
    redis.call('ZREM', KEYS[3], decoded['y'] .. '\0' .. job_id)
  end
end

redis.call('HSET', KEYS[2], job_id, ARGV[2])
redis.call('ZADD', KEYS[1], due, job_id)
if ARGV[6] ~= '' then redis.call('ZADD', KEYS[3], 0, ARGV[6]) end
if tonumber(ARGV[9]) > 0 then
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[9], '*', 'event',
             code == 1 and 'scheduled' or 'rescheduled', 'job', job_id,
             'task', ARGV[10], 'key', ARGV[11], 'due', due)
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0)
if head[1] == job_id then redis.call('PUBLISH', ARGV[7], ARGV[8]) end
return {code, due, false}
