--[[ unindex: forget the task id indexes of jobs claim_due pushed to the broker itself.

KEYS[1] jobs      HASH  job id -> envelope
KEYS[2..] task    STRING  the task id index key (keys.py) of each job, in ARGV's order

ARGV[1]   the job id the index KEYS[2] names (ARGV[2..]: one per further key)

An index goes only while it names its job and that job is not stored again: a retry's
copy, scheduled since under the same task id, keeps it (as ack does).
Returns the number of indexes deleted.

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when its jobs
key holds the wrong type of value.
]]
-- include: damaged.lua
local problem = damaged({1, 'hash'})
if problem then return redis.error_reply(problem) end
local n = 0
for i = 1, #ARGV do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 0 and redis.call('GET', KEYS[i + 1]) == ARGV[i]
  then
    n = n + redis.call('DEL', KEYS[i + 1])
  end
end
return n
