--[[ pause: pause or resume a task or a queue on one shard (pausing.py).

KEYS[1] paused    HASH  "task:<name>" / "queue:<name>" -> who paused it (JSON: by, at ms)
KEYS[2] journal   STREAM
KEYS[3] releasing HASH  the releases under way (include/releasing.lua)

ARGV[1] journal maxlen (0: not journaled on this shard; the store journals on shard 0)
ARGV[2] "pause" or "resume"
ARGV[3] the paused hash field
ARGV[4] who did it (journaled)
ARGV[5] the resume's token (unique per call; "" for a pause)

Pause marks the field; the claim script holds each job of it as it falls due. Resume
begins a release and unmarks it: the store then gives back the jobs no pause holds any
more (release-6.lua, call by call), and a carrier finishes it if the store stops part way.
Returns 1 when a resume unmarked the field (it was paused on this shard), else 0.

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: damaged.lua
-- include: journal.lua
-- include: now.lua
-- include: releasing.lua
local problem = damaged({1, 'hash', 2, 'stream', 3, 'hash'})
if problem then return redis.error_reply(problem) end
local action, field, by = ARGV[2], ARGV[3], ARGV[4]
local kind, name = string.match(field, '^(%a+):(.*)$')
journal(2, action == 'pause' and 'paused' or 'resumed', kind, name, 'by', by)
if action == 'pause' then
  redis.call('HSET', KEYS[1], field, cjson.encode({by = by, at = now_ms()}))
else  -- a write that needs memory first: a full Redis refuses the call, removing nothing
  note_release(3, 'paused', ARGV[5], '')
  return redis.call('HDEL', KEYS[1], field)
end
return 0
