-- The shard's journal, capped near ARGV[1]: delayq_journal_maxlen, the first ARGV of every
-- script that journals (0: no journal). journal(n, event, field, value, ...) appends an
-- event to the journal KEYS[n] and trims it; a script that may append many events in one
-- call appends each with journal_batch(n, ...) and calls trim_journal(n) once at its end.
-- A journal given the largest entry id by hand (XADD or XSETID) refuses every event: the
-- call goes on without it, as its writes are made (`delayq health` names that journal).
local JOURNAL_MAXLEN = tonumber(ARGV[1])
local function append(...)
  local added = redis.pcall('XADD', ...)
  if type(added) == 'table' and added.err
      and not string.find(added.err, 'exhausted the last possible ID', 1, true) then
    error(redis.REDIS_VERSION and added or added.err)  -- raised as redis.call raises it:
  end                                                  -- Redis 7 a table, 6.2 its text
end
local function journal(n, event, ...)
  if JOURNAL_MAXLEN > 0 then
    append(KEYS[n], 'MAXLEN', '~', JOURNAL_MAXLEN, '*', 'event', event, ...)
  end
end
local function journal_batch(n, event, ...)
  if JOURNAL_MAXLEN > 0 then append(KEYS[n], '*', 'event', event, ...) end
end
local function trim_journal(n)
  if JOURNAL_MAXLEN > 0 then redis.call('XTRIM', KEYS[n], 'MAXLEN', '~', JOURNAL_MAXLEN) end
end
