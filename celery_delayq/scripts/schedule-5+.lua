--[[ schedule: store jobs of one shard and put them on its due set.

KEYS[1] due       ZSET  job id -> due ms
KEYS[2] jobs      HASH  job id -> envelope; a replaced envelope of a copy a carrier holds
                        (not pending) is kept there under kept(job id) (include/kept.lua)
KEYS[3] bykey     ZSET  business-key index
KEYS[4] journal   STREAM
KEYS[5] counts    HASH  task name -> jobs stored (pending or being promoted)
KEYS[6] outcome   HASH  (when ARGV[5] is not "0") job id -> "<code> <row>": what a call of
                  one run did with the job of that input row. The same row again (a
                  retried Spark task, a recomputed partition) is not written again: its
                  first code is returned, with no due ms (nil); another row of the run with
                  that id gets code -2
KEYS[6 or 7]      answer  STRING  (the one ARGV[7] names, when not "0"; after the outcome) this
                  call's reply, kept ARGV[8] ms once it wrote: redis-py sends a call whose
                  reply was lost again, and that second run answers the first's and writes
                  nothing (a job due at once may be published and gone by then)
KEYS[6, 7 or 8..] task  STRING  the task id index key of each job whose task id is not its
                  job id (keys.py), in the order of those jobs

ARGV[1] journal maxlen (0: no journal)
ARGV[2] if_exists: "keep" | "replace" | "error" | "retry" (a running task's own retry:
        replace a stored call of its task id, keep one of another, newer call)
ARGV[3] wake channel
ARGV[4] shard number (published on the wake channel)
ARGV[5] ms the outcome hash is kept after this call ("0": no outcome hash)
ARGV[6] ms a task id index key outlives its job's due time
ARGV[7] the number of the answer key in KEYS, "0" for none
ARGV[8] ms the answer is kept
ARGV[9..] eight values per job:
          job id, envelope (three lines of JSON, see envelope.py),
          absolute due ms or "" (then the delay below counts from Redis's clock, TIME),
          delay ms, bykey member ("<key>\0<job id>") or "", task name, business key or "",
          the number of its task id index key in KEYS or 0 (none: its task id is its id),
          and with an outcome hash a ninth: the input row's name within the run

Returns three values per job: code, due ms (nil when the job is not pending: a carrier
holds it), and the existing envelope (kept, exists) or the replaced job's own task id
(replaced: the store forgets its index, unindex), or nil.
Codes:
   1 scheduled    2 replaced an existing job
   0 kept the existing job (if_exists=keep, or retry of another call)
  -1 exists (if_exists=error), nothing written
  -2 another input row of the run (KEYS[6]) has this job id, nothing written

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: counts.lua
-- include: damaged.lua
-- include: first_line.lua
-- include: journal.lua
-- include: kept.lua
-- include: now.lua
local checks = {1, 'zset', 2, 'hash', 3, 'zset', 4, 'stream', 5, 'hash'}
local outcome = ARGV[5] ~= '0' and KEYS[6]
if outcome then checks[#checks + 1], checks[#checks + 2] = 6, 'hash' end
local problem = damaged(checks)
if problem then return redis.error_reply(problem) end
local answer_at = tonumber(ARGV[7])
if answer_at > 0 then
  local kept_reply = redis.call('GET', KEYS[answer_at])
  if kept_reply then  -- this call ran before: its reply, numbers kept as text
    local reply = cjson.decode(kept_reply)
    for i = 1, #reply, 3 do  -- (a due time of none stays false: a nil would end the reply)
      reply[i], reply[i + 1] = tonumber(reply[i]), tonumber(reply[i + 1]) or false
    end
    return reply
  end
end
-- Whether a stored call's first line (``was``) is of another task id than a new call's
-- (``is``): each holds its task id as "i", or none when it is the job id. A line that
-- cannot be read, or whose "i" is no text, is taken as the call's own (replaced).
local function another_call(was, is)
  if not was or not is or (was['i'] ~= nil and type(was['i']) ~= 'string') then
    return false
  end
  return (was['i'] or '') ~= (is['i'] or '')
end
local now = now_ms()
local if_exists = ARGV[2]
local index_grace = tonumber(ARGV[6])
local out = {}
local written = {}
local per_task = {}  -- task name -> change of its count, written once per call

for i = 9, #ARGV, outcome and 9 or 8 do
  local job_id, envelope, member, task = ARGV[i], ARGV[i + 1], ARGV[i + 4], ARGV[i + 5]
  local due = now + tonumber(ARGV[i + 3])
  if ARGV[i + 2] ~= '' then due = tonumber(ARGV[i + 2]) end
  local first = outcome and redis.call('HGET', KEYS[6], job_id)
  if first then  -- this run gave the id its job already: never a second write
    local code, row = string.match(first, '^(%S+) (.*)$')
    out[#out + 1] = row == ARGV[i + 8] and tonumber(code) or -2
    out[#out + 1] = false
    out[#out + 1] = false
  else
    -- keep / error: one lookup that also writes a new job; replace needs the old one first
    local old, code = nil, 1
    local replacing = if_exists == 'replace' or if_exists == 'retry'
    if replacing then
      old = redis.call('HGET', KEYS[2], job_id)
      if old and if_exists == 'retry' then  -- kept: a readable call of another task id
        replacing = not another_call(first_line(old), first_line(envelope))
      end
    elseif redis.call('HSETNX', KEYS[2], job_id, envelope) == 0 then
      old = redis.call('HGET', KEYS[2], job_id)
    end
    if old and not replacing then
      local old_due = redis.call('ZSCORE', KEYS[1], job_id)  -- nil: being promoted
      out[#out + 1] = if_exists == 'error' and -1 or 0
      out[#out + 1] = old_due and tonumber(old_due) or false
      out[#out + 1] = old
    else
      local replaced_task_id = false
      if old then
        code = 2
        if not redis.call('ZSCORE', KEYS[1], job_id) then  -- a carrier holds the old copy
          redis.call('HSETNX', KEYS[2], kept(job_id), old)
        end
        local fields = first_line(old)
        if fields then
          if type(fields['i']) == 'string' then replaced_task_id = fields['i'] end
          if type(fields['y']) == 'string' then
            redis.call('ZREM', KEYS[3], fields['y'] .. '\0' .. job_id)
          end
          if type(fields['t']) == 'string' then
            per_task[fields['t']] = (per_task[fields['t']] or 0) - 1
          end
        end
      end
      if replacing then redis.call('HSET', KEYS[2], job_id, envelope) end
      per_task[task] = (per_task[task] or 0) + 1
      redis.call('ZADD', KEYS[1], due, job_id)
      if member ~= '' then redis.call('ZADD', KEYS[3], 0, member) end
      local index = tonumber(ARGV[i + 7])
      if index > 0 then
        redis.call('SET', KEYS[index], job_id, 'PX', math.max(due - now, 0) + index_grace)
      end
      journal_batch(4, code == 1 and 'scheduled' or 'rescheduled', 'job', job_id,
                    'task', task, 'key', ARGV[i + 6], 'due', due)
      out[#out + 1] = code
      out[#out + 1] = due
      out[#out + 1] = replaced_task_id
      written[job_id] = true
    end
    if outcome then redis.call('HSET', KEYS[6], job_id, out[#out - 2] .. ' ' .. ARGV[i + 8]) end
  end
end
for task, n in pairs(per_task) do
  if n ~= 0 then add_count(5, task, n) end
end
trim_journal(4)
local head = redis.call('ZRANGE', KEYS[1], 0, 0)
if head[1] and written[head[1]] then redis.call('PUBLISH', ARGV[3], ARGV[4]) end
if outcome then redis.call('PEXPIRE', KEYS[6], ARGV[5]) end
if answer_at > 0 and next(written) then
  local text = {}  -- cjson writes numbers with 14 digits; a held score has 16
  for i, value in ipairs(out) do
    text[i] = type(value) == 'number' and string.format('%.0f', value) or value
  end
  redis.call('SET', KEYS[answer_at], cjson.encode(text), 'PX', ARGV[8])
end
return out
