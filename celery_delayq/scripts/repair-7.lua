--[[ repair: fix one finding of `delayq check --repair` on one shard. The finding is checked
again here, atomically, so a job that changed since the scan is left alone.

KEYS[1] due       ZSET  job id -> due ms
KEYS[2] inflight  ZSET  job id -> lease deadline ms
KEYS[3] jobs      HASH  job id -> envelope, and kept(job id) (kept.lua)
KEYS[4] bykey     ZSET  business-key index
KEYS[5] dead      HASH  job id -> {"reason", "envelope", "at"} (JSON)
KEYS[6] counts    HASH  task name -> jobs stored (pending or being promoted)
KEYS[7] journal   STREAM

ARGV[1] journal maxlen (0: no journal)
ARGV[2] what to repair:
        "due" / "inflight"  a member (job id) without an envelope: removed (an in-flight
                            one with its kept field)
        "kept"              a kept field of a job id (ARGV[3]) without a lease, and not
                            itself a job's id on due or inflight: removed
        "bykey"             a member "<key>\0<job id>" whose job is gone or has another key:
                            removed
        "orphan"            an envelope (job id) in neither due nor inflight: dead-lettered
                            with the reason ARGV[4], never deleted
        "count"             add ARGV[4] to the count of the task ARGV[3]
        "held"              a held job (held.py) nothing holds any more, due score
                            ARGV[4]: given its due time back (the carrier's next claim,
                            within its idle timeout, holds it again if it must)
ARGV[3] the member, job id or task name
ARGV[4] the reason ("orphan"), the difference ("count"), the score seen ("held"), else ""
ARGV[5] "1": only say whether the finding still holds, writing nothing (`delayq check`
        without --repair: a scan of a store in use meets jobs that changed under it);
        a count is not checked again (check.py reads counts before and after its scan)

Returns 1 when repaired (or, with ARGV[5], when it would be), 0 when there was nothing
(left) to repair.
]]
-- include: counts.lua
-- include: first_line.lua
-- include: held.lua
-- include: journal.lua
-- include: kept.lua
-- include: now.lua
local what, value, extra, looking = ARGV[2], ARGV[3], ARGV[4], ARGV[5] == '1'
-- 1 when a member is in the sorted set KEYS[at], else 0
local function member(at, name) return redis.call('ZSCORE', KEYS[at], name) and 1 or 0 end
if what == 'due' or what == 'inflight' then
  if redis.call('HEXISTS', KEYS[3], value) == 1 then return 0 end
  if looking then return member(what == 'due' and 1 or 2, value) end
  if what == 'due' then return redis.call('ZREM', KEYS[1], value) end
  redis.call('HDEL', KEYS[3], kept(value))
  return redis.call('ZREM', KEYS[2], value)
end
if what == 'kept' then  -- (a field on a set is a job whose own id begins as kept ids do)
  local field = kept(value)
  if redis.call('ZSCORE', KEYS[2], value) or redis.call('ZSCORE', KEYS[1], field)
     or redis.call('ZSCORE', KEYS[2], field) then return 0 end
  if looking then return redis.call('HEXISTS', KEYS[3], field) end
  return redis.call('HDEL', KEYS[3], field)
end
if what == 'bykey' then
  local cut = string.find(value, '\0', 1, true)
  local env = cut and redis.call('HGET', KEYS[3], string.sub(value, cut + 1))
  if cut and (first_line(env) or {})['y'] == string.sub(value, 1, cut - 1) then return 0 end
  if looking then return member(4, value) end
  return redis.call('ZREM', KEYS[4], value)
end
if what == 'held' then
  local score = tonumber(redis.call('ZSCORE', KEYS[1], value))
  if score ~= tonumber(extra) then return 0 end  -- changed since the scan
  if looking then return 1 end
  local base = score >= RATE_BASE + MIN_DUE and RATE_BASE or PAUSED_BASE
  redis.call('ZADD', KEYS[1], score - base, value)
  return 1
end
if what == 'count' then
  if looking then return 1 end
  add_count(6, value, extra)
  return 1
end
-- orphan
local env = redis.call('HGET', KEYS[3], value)
if not env or redis.call('ZSCORE', KEYS[1], value) or redis.call('ZSCORE', KEYS[2], value)
    or redis.call('HEXISTS', KEYS[5], value) == 1 then
  return 0  -- not orphaned any more, or a dead letter of this id would be overwritten
end
if looking then return 1 end
redis.call('HSET', KEYS[5], value, cjson.encode({reason = extra, envelope = env, at = now_ms()}))
redis.call('HDEL', KEYS[3], value)
local fields = first_line(env)
local task, key = text_field(fields, 't'), text_field(fields, 'y')
if task ~= '' then add_count(6, task, -1) end
if key ~= '' then redis.call('ZREM', KEYS[4], key .. '\0' .. value) end
journal(7, 'dead', 'job', value, 'task', task, 'reason', extra)
return 1
