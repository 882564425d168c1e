-- include: first_line.lua
-- Held jobs (held.py): a due job a pause holds has the due score PAUSED_BASE + its due
-- time in ms; one its queue's rate limit holds, RATE_BASE + its due time.
local PAUSED_BASE, RATE_BASE = 1125899906842624, 2251799813685248
local MIN_DUE, MAX_DUE = -62135596800000, 253402300799999
-- first_fields(env, default_queue): the task name and queue of a job's envelope or first
-- line (the queue it names, else the default), or nil when that line is not a JSON object.
local function first_fields(env, default_queue)
  local fields = first_line(env)
  if not fields then return nil end
  local queue = fields['q']
  if type(queue) ~= 'string' or queue == '' then queue = default_queue end
  return type(fields['t']) == 'string' and fields['t'] or '', queue
end
-- held_by(paused, task, queue): whether a pause holds a job of this task and queue;
-- paused is a set of the paused hash's fields.
local function held_by(paused, task, queue)
  return (task ~= '' and paused['task:' .. task]) or paused['queue:' .. queue] or false
end
-- A job a rate limit holds, as a member of the waiting set: its queue, due time and id,
-- so that ZRANGEBYLEX over "<queue>\0" lists the queue's jobs oldest first (the due time
-- as fixed-width text of its distance from MIN_DUE); waiting_job reads one back: its due
-- time and job id, or nil when the member is not one (damaged: dropped, never an error).
local function waiting_member(queue, due, job_id)
  return queue .. '\0' .. string.format('%019.3f', tonumber(due) - MIN_DUE) .. '\0' .. job_id
end
local function waiting_job(member)
  local due, job_id = string.match(member, '^[^%z]*%z([^%z]*)%z(.*)$')
  due = tonumber(due)
  if not due then return nil end
  return due + MIN_DUE, job_id
end
