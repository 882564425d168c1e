--[[ unindex: forget the task id indexes of jobs that no longer have those task ids: jobs
claim_due pushed to the broker itself, jobs a call replaced under a new task id, and jobs a
cancel removed.

KEYS[1] jobs      HASH  job id -> envelope
KEYS[2..] task    STRING  the task id index key (keys.py) of each job, in ARGV's order

ARGV[1], ARGV[2]  the job id the index KEYS[2] names, and that index's task id (then a
                  pair per further key)

An index goes only while it names its job and that job is not stored under its task id:
a retry's copy stored again since under the same task id keeps it.
Returns the number of indexes deleted.

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when its jobs
key holds the wrong type of value.
]]
-- include: damaged.lua
-- include: first_line.lua
local problem = damaged({1, 'hash'})
if problem then return redis.error_reply(problem) end
local n = 0
for i = 1, #ARGV, 2 do
  local job_id, task_id, at = ARGV[i], ARGV[i + 1], (i + 3) / 2
  if redis.call('GET', KEYS[at]) == job_id
      and text_field(first_line(redis.call('HGET', KEYS[1], job_id)), 'i') ~= task_id then
    n = n + redis.call('DEL', KEYS[at])
  end
end
return n
