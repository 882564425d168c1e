--[[ drop: an operator gives up dead-lettered jobs for good; they are journaled as cancelled.

KEYS[1] dead      HASH  job id -> {"reason", "envelope", "at"} (JSON)
KEYS[2] journal   STREAM
KEYS[3] counts    HASH  task name -> jobs stored; the field "" counts cancels
KEYS[4] answer    STRING this call's reply, kept for the call sent again (answer.lua)

ARGV[1] journal maxlen (0: no journal)
ARGV[2] who dropped them and why (the journal's "by", as a cancel's)
ARGV[3..] job ids, each followed by the SHA-1 (hex) of its dead letter as the caller read
          it, or "" for whatever letter it has

Returns the number of dead letters dropped (an id that is not dead-lettered, or whose
letter is not the one read, written again since, is skipped).
A dead letter that cannot be read is dropped too, journaled with an empty task and key.
Each is journaled with "from" = "dead": a live job may have its id meanwhile (scheduled
again), and it is not the one cancelled.

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: answer.lua
-- include: counts.lua
-- include: damaged.lua
-- include: first_line.lua
-- include: journal.lua
local problem = damaged({1, 'hash', 2, 'stream', 3, 'hash'})
if problem then return redis.error_reply(problem) end
local again = answered(4)
if again then return again end
local dropped = 0
for i = 3, #ARGV, 2 do
  local job_id, read = ARGV[i], ARGV[i + 1]
  local dead = redis.call('HGET', KEYS[1], job_id)
  if dead and (read == '' or redis.sha1hex(dead) == read) then
    local entry = first_line(dead)  -- a dead letter is one line of JSON
    local fields = entry and first_line(text_field(entry, 'envelope'))
    redis.call('HDEL', KEYS[1], job_id)
    journal_batch(2, 'cancelled', 'job', job_id, 'task', text_field(fields, 't'),
                  'key', text_field(fields, 'y'), 'by', ARGV[2], 'from', 'dead')
    dropped = dropped + 1
  end
end
if dropped > 0 then add_count(3, '', dropped) end
trim_journal(2)
return answer(4, dropped, dropped > 0)
