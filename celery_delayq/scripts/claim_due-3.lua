--[[ claim_due: move up to a batch of due jobs from due to inflight under a lease.

KEYS[1] due       ZSET  job id -> due ms
KEYS[2] inflight  ZSET  job id -> lease deadline ms
KEYS[3] jobs      HASH  job id -> envelope

ARGV[1] batch size
ARGV[2] lease in ms

Returns {now ms, next due ms or -1, id1, due1, envelope1 or nil, id2, ...}
The next due time is that of the earliest job left on the due set.
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, ARGV[1])
local out = {now, -1}
local deadline = now + tonumber(ARGV[2])
for i = 1, #ids, 2 do
  local job_id = ids[i]
  redis.call('ZREM', KEYS[1], job_id)
  redis.call('ZADD', KEYS[2], deadline, job_id)
  out[#out + 1] = job_id
  out[#out + 1] = ids[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[3], job_id)
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if head[2] then out[2] = tonumber(head[2]) end
return out
