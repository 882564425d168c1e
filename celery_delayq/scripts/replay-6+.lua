--[[ replay: put a dead-lettered job back on the due set, due now.

KEYS[1] dead      HASH  job id -> {"reason", "envelope", "at"} (JSON)
KEYS[2] jobs      HASH  job id -> envelope
KEYS[3] due       ZSET  job id -> due ms
KEYS[4] bykey     ZSET  business-key index
KEYS[5] journal   STREAM
KEYS[6] counts    HASH  task name -> jobs stored (pending or being promoted)
KEYS[7] answer    STRING this call's reply, kept for the call sent again (answer.lua)

ARGV[1] journal maxlen (0: no journal)
ARGV[2] job id
ARGV[3] envelope to store instead of the dead one, or "" to keep it
ARGV[4] wake channel
ARGV[5] shard number
ARGV[6] the SHA-1 (hex) of its dead letter as the caller read it, or "" for whatever
        letter it has

Returns 1 when replayed, 0 when no dead job has this id (or its letter is not the one
read: written again since), -1 when a live job has it, and {-2, why} when the dead letter
cannot be replayed as it is (not a JSON object, or no envelope text in it) and ARGV[3]
gives no envelope: nothing is written then.

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: answer.lua
-- include: counts.lua
-- include: damaged.lua
-- include: first_line.lua
-- include: journal.lua
-- include: now.lua
local problem = damaged({1, 'hash', 2, 'hash', 3, 'zset', 4, 'zset', 5, 'stream', 6, 'hash'})
if problem then return redis.error_reply(problem) end
local again = answered(7)
if again then return again end
local job_id = ARGV[2]
local dead = redis.call('HGET', KEYS[1], job_id)
if not dead or (ARGV[6] ~= '' and redis.sha1hex(dead) ~= ARGV[6]) then return 0 end
if redis.call('HEXISTS', KEYS[2], job_id) == 1 then return -1 end
local env = ARGV[3]
if env == '' then
  local entry = first_line(dead)  -- a dead letter is one line of JSON
  if not entry then return {-2, 'not a JSON object'} end
  env = entry['envelope']
  if type(env) ~= 'string' then return {-2, 'no envelope'} end
end
local now = now_ms()
redis.call('HSET', KEYS[2], job_id, env)
redis.call('ZADD', KEYS[3], now, job_id)
redis.call('HDEL', KEYS[1], job_id)
local task = ''
local fields = first_line(env)
if fields then
  if type(fields['y']) == 'string' then
    redis.call('ZADD', KEYS[4], 0, fields['y'] .. '\0' .. job_id)
  end
  if type(fields['t']) == 'string' then
    task = fields['t']
    add_count(6, task, 1)
  end
end
journal(5, 'replayed', 'job', job_id, 'task', task, 'due', now)
redis.call('PUBLISH', ARGV[4], ARGV[5])
return answer(7, 1, true)
