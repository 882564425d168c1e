--[[ worker_events: a worker's batch of events (started, succeeded...) appended to a shard's
journal once, however often the batch is sent: by redis-py, whose call timed out while
Redis ran it, or by the worker's outbox, which holds a batch whose write failed and sends
it again with the same token.

KEYS[1] journal   STREAM
KEYS[2] answer    STRING the batch's own key (its token): set, it says the batch is written

ARGV[1] journal maxlen (> 0)
ARGV[2] how long the answer key is kept, ms (connection.resend_window_ms: as long as
        redis-py may send the call again)
ARGV[3..] the events, each as N (its number of fields) then its N fields and values
          (the first field "event")

Returns 1 when it appended the events, 0 when the batch was written before.
The answer key is written first: on a full Redis (maxmemory) it is refused, the call
fails with nothing written (as an XADD is refused), and the batch can be sent again.

Fails with "DAMAGED <key> holds a <type>, not a stream", writing nothing, when the journal
holds another type of value. A journal with no entry id left takes no event (journal.lua).
]]
-- include: damaged.lua
-- include: journal.lua
local problem = damaged({1, 'stream'})
if problem then return redis.error_reply(problem) end
if not redis.call('SET', KEYS[2], 1, 'NX', 'PX', ARGV[2]) then return 0 end
local i = 3
while i <= #ARGV do
  local last = i + 2 * tonumber(ARGV[i])
  append(KEYS[1], '*', unpack(ARGV, i + 1, last))  -- (include/journal.lua)
  i = last + 1
end
trim_journal(1)
return 1
