-- Held jobs (pausing.py): a held job's due score is HELD_BASE + its due time in ms.
local HELD_BASE = 1125899906842624
local HELD_MIN, HELD_MAX = HELD_BASE - 62135596800000, HELD_BASE + 253402300799999
-- held_by(paused, line, default_queue): the paused hash field (a flat HGETALL reply
-- turned into a set) that holds the job of first line `line`, or nil.
local function held_by(paused, line, default_queue)
  local ok, fields = pcall(cjson.decode, line)
  if not ok or type(fields) ~= 'table' then return nil end
  local task, queue = fields['t'], fields['q']
  if type(queue) ~= 'string' or queue == '' then queue = default_queue end
  if type(task) == 'string' and paused['task:' .. task] then return 'task:' .. task end
  if paused['queue:' .. queue] then return 'queue:' .. queue end
  return nil
end
