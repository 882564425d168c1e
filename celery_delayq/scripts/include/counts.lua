-- add_count(n, task, delta): add delta to task's count in the counts hash KEYS[n] (keys.py,
-- 6.). A count Redis cannot add to (damaged: not an integer, or at the int64 limit) becomes
-- delta: counts are statistics (Store.counts, delayq check), and Redis keeps a script's
-- earlier writes when it fails, so a failed HINCRBY would report an error for a write that
-- was made (a job stored, forgotten, cancelled) and leave the journal without its event.
local function add_count(n, task, delta)
  if type(redis.pcall('HINCRBY', KEYS[n], task, delta)) == 'table' then
    redis.call('HSET', KEYS[n], task, delta)
  end
end
