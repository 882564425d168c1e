--[[ release: on one shard, give back up to ARGV[4] jobs that a pause or a rate limit held
and nothing holds any more: their due times back, so the carrier promotes them oldest
first. The store calls it after a resume (pause-3) or a limit's removal (limit-3) until it
is done, so a shard holding a million jobs never blocks Redis for long; a carrier goes on
with a release whose caller stopped part way (include/releasing.lua).

KEYS[1] paused    HASH  "task:<name>" / "queue:<name>" -> who paused it (pausing.py)
KEYS[2] limits    HASH  "rate:<queue>" -> its limit or "off" (ratelimit.py)
KEYS[3] due       ZSET  job id -> due ms (held jobs: a base + due ms, see held.py)
KEYS[4] jobs      HASH  job id -> envelope
KEYS[5] waiting   ZSET  "<queue>\0<due>\0<job id>": the jobs rate limits hold (claim_due)
KEYS[6] releasing HASH  the releases under way (include/releasing.lua)

ARGV[1] "paused": the jobs held by a pause that no pause (KEYS[1]) holds any more
        "rate": the jobs held for queue ARGV[2] while it has no limit in force
ARGV[2] the queue ("rate"), else ""
ARGV[3] where to go on ("paused"): "<score> <job id>" of the last job looked at and left
        held, as the previous call returned it; "" from the first held job
ARGV[4] how many jobs to look at (at most)
ARGV[5] the default queue (of envelopes that name none)
ARGV[6] wake channel
ARGV[7] shard number
ARGV[8] the token of the resume or removal whose release this is

"paused" walks the shard's paused jobs in due order, from just after the job ARGV[3]
names: jobs given back leave that range and jobs left held stay, so the next one to look
at is the one ranked after it (if that job was cancelled or moved since, the walk goes on
from the first job of its score, looking at its ties again). "rate" takes the queue's
members of the waiting set from the front (their order is the queue's), drops each and
gives back its job if still held for the queue; a job held for it without a member (a
damaged store) is left to `delayq check`, which finds it stranded.

The release's entry in KEYS[6] is moved on to where this call stopped, or removed when it
is done, only while it holds ARGV[8]: a later resume or removal began a walk of its own
from the first held job, which this one's end does not finish.

Returns {jobs given back, 1 if there may be more else 0, where to go on}; publishes the
shard on the wake channel when it gave any back.

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: damaged.lua
-- include: held.lua
-- include: releasing.lua
local problem = damaged({1, 'hash', 2, 'hash', 3, 'zset', 4, 'hash', 5, 'zset', 6, 'hash'})
if problem then return redis.error_reply(problem) end
local kind, queue, limit = ARGV[1], ARGV[2], tonumber(ARGV[4])
local released, more, cursor = 0, 0, ARGV[3]

local function give_back(job_id, score, base)
  redis.call('ZADD', KEYS[3], score - base, job_id)
  released = released + 1
end

if kind == 'paused' then
  local first
  local score, job_id = string.match(cursor, '^(%S+) (.*)$')
  if not score then
    first = redis.call('ZCOUNT', KEYS[3], '-inf', string.format('(%.17g', PAUSED_BASE + MIN_DUE))
  else
    local rank = redis.call('ZRANK', KEYS[3], job_id)
    if rank and redis.call('ZSCORE', KEYS[3], job_id) == score then
      first = rank + 1
    else
      first = redis.call('ZCOUNT', KEYS[3], '-inf', '(' .. score)
    end
  end
  local paused = {}
  local flat = redis.call('HGETALL', KEYS[1])
  for i = 1, #flat, 2 do paused[flat[i]] = true end
  local held = redis.call('ZRANGE', KEYS[3], first, first + limit - 1, 'WITHSCORES')
  local looked = 0
  for i = 1, #held, 2 do
    if tonumber(held[i + 1]) > PAUSED_BASE + MAX_DUE then break end
    looked = looked + 1
    local task, its_queue = first_fields(redis.call('HGET', KEYS[4], held[i]), ARGV[5])
    if task and held_by(paused, task, its_queue) then
      cursor = held[i + 1] .. ' ' .. held[i]
    else
      give_back(held[i], tonumber(held[i + 1]), PAUSED_BASE)
    end
  end
  if looked == limit then more = 1 end
else
  local rate = redis.call('HGET', KEYS[2], 'rate:' .. queue)
  if not rate or rate == 'off' then  -- a limit set again holds its jobs itself
    local members = redis.call('ZRANGEBYLEX', KEYS[5], '[' .. queue .. '\0',
                               '(' .. queue .. '\1', 'LIMIT', 0, limit)
    for _, member in ipairs(members) do
      redis.call('ZREM', KEYS[5], member)
      local due, job_id = waiting_job(member)
      local score = due and tonumber(redis.call('ZSCORE', KEYS[3], job_id))
      if score and score == RATE_BASE + due then give_back(job_id, score, RATE_BASE) end
    end
    if #members == limit then more = 1 end
  end
end
local entry = kind == 'paused' and 'paused' or 'rate:' .. queue
local under_way = redis.call('HGET', KEYS[6], entry)
if under_way and string.match(under_way, '^%S+') == ARGV[8] then
  if more == 1 then
    note_release(6, entry, ARGV[8], cursor)
  else
    redis.call('HDEL', KEYS[6], entry)
  end
end
if released > 0 then redis.call('PUBLISH', ARGV[6], ARGV[7]) end
return {released, more, cursor}
