--[[ cancel: remove pending jobs, by job id or by business key, atomically against claim_due.

KEYS[1] due       ZSET  job id -> due ms
KEYS[2] jobs      HASH  job id -> envelope, and kept(job id) -> the envelope of the copy
                        a carrier holds while a later call stands in its place (kept.lua)
KEYS[3] inflight  ZSET  job id -> lease deadline ms
KEYS[4] bykey     ZSET  business-key index
KEYS[5] journal   STREAM
KEYS[6] counts    HASH  task name -> jobs stored; field "" counts cancels
KEYS[7] answer    STRING this call's reply, kept for the call sent again (answer.lua)

ARGV[1] journal maxlen (0: no journal)
ARGV[2] "id", "key", or "move": an id whose job is replaced under a business key of another
        shard (journaled "moved", not counted as a cancel); its envelope goes even while a
        carrier holds it (that copy is then delivered, never given back; its envelope is
        kept only for the case the id comes back to this shard and is cancelled there)
ARGV[3] the job id, or the business key
ARGV[4] who cancelled / why (journal), may be ""
ARGV[5] for "id": the Celery task id the job must have, or "" for any. A job of that id
        with another task id (a later call replaced it) is left alone: answered -1.
        For "key": the key's index member to go on after ("" to start at the first)
ARGV[6] for "key": the most index members to look at in this call, so that a key with very
        many jobs is cancelled in many short calls, not one that blocks Redis for seconds

A pending copy cancelled while a carrier holds an earlier one gives its place in jobs back
to the envelope kept for that copy, so ack, recover and dead see the call the carrier holds.

Returns {code, number cancelled, ...}. For "id" (and "move"), code is 1 cancelled, 0 too
late (a carrier holds it, or an earlier copy of it: that is delivered), -1 unknown, then
the cancelled job's Celery task id ("" when it is the job id, or when nothing was
cancelled) and its task name ("" when nothing was cancelled). For "key", code is the last
index member looked at when it looked at ARGV[6] of them (more may follow: call again with
it as ARGV[5]), else "", followed by three values per job cancelled: its Celery task id
("" when it is the job id), its job id and its task name.

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: answer.lua
-- include: counts.lua
-- include: damaged.lua
-- include: first_line.lua
-- include: journal.lua
-- include: kept.lua
local problem = damaged({1, 'zset', 2, 'hash', 3, 'zset', 4, 'zset', 5, 'stream', 6, 'hash'})
if problem then return redis.error_reply(problem) end
local again = answered(7)
if again then return again end
local kind, value = ARGV[2], ARGV[3]
local ids
local more = ''  -- for "key": where the next call goes on, "" when this one reached the end
if kind == 'key' then
  local first = ARGV[5] == '' and '[' .. value .. '\0' or '(' .. ARGV[5]
  local members = redis.call('ZRANGEBYLEX', KEYS[4], first, '(' .. value .. '\1', 'LIMIT', 0,
                             tonumber(ARGV[6]))
  ids = {}
  for i, member in ipairs(members) do ids[i] = string.sub(member, #value + 2) end
  if #members == tonumber(ARGV[6]) then more = members[#members] end
else
  ids = {value}
  if ARGV[5] ~= '' then
    local fields = first_line(redis.call('HGET', KEYS[2], value))
    if not (fields and fields['i'] == ARGV[5]) then return {-1, 0, '', ''} end
  end
end
local cancelled = 0
local reply = {more, 0}  -- where to go on ("key"), the count, then each job's task id,
-- job id and task name
for _, job_id in ipairs(ids) do
  local pending = redis.call('ZREM', KEYS[1], job_id) == 1
  -- a moved job leaves even while a carrier holds it: then its lease stays, without an
  -- envelope, so ack / recover / dead only end that lease and never bring the old copy back
  local moving = kind == 'move' and redis.call('HEXISTS', KEYS[2], job_id) == 1
  if pending or moving then
    local env = redis.call('HGET', KEYS[2], job_id)
    local fields = first_line(env)
    local task, key = text_field(fields, 't'), text_field(fields, 'y')
    reply[#reply + 1] = text_field(fields, 'i')
    reply[#reply + 1] = job_id
    reply[#reply + 1] = task
    local held = redis.call('ZSCORE', KEYS[3], job_id)
    if moving or not held then
      if redis.call('HDEL', KEYS[2], job_id) == 1 and task ~= '' then add_count(6, task, -1) end
      if held then redis.call('HSETNX', KEYS[2], kept(job_id), env) end
    else  -- the copy a carrier holds gets its envelope back (none kept: it is this one)
      local own = redis.call('HGET', KEYS[2], kept(job_id))
      if own then
        redis.call('HSET', KEYS[2], job_id, own)
        redis.call('HDEL', KEYS[2], kept(job_id))
        if task ~= '' then add_count(6, task, -1) end
        local its = text_field(first_line(own), 't')
        if its ~= '' then add_count(6, its, 1) end
      end
    end
    if kind ~= 'move' then add_count(6, '', 1) end
    if key ~= '' then redis.call('ZREM', KEYS[4], key .. '\0' .. job_id) end
    journal(5, kind == 'move' and 'moved' or 'cancelled',
            'job', job_id, 'task', task, 'key', key, 'by', ARGV[4])
    cancelled = cancelled + 1
  end
end
if kind == 'key' then
  reply[2] = cancelled
  return answer(7, reply, cancelled > 0)
end
-- a carrier holds an earlier copy (the job was scheduled again while in flight): that one
-- is delivered, so the answer is "too late" even when the pending copy was cancelled
local task_id, task = reply[3] or '', reply[5] or ''
if redis.call('ZSCORE', KEYS[3], value) then
  return answer(7, {0, cancelled, task_id, task}, cancelled > 0)
end
if cancelled == 1 then return answer(7, {1, 1, task_id, task}, true) end
return {-1, 0, '', ''}
