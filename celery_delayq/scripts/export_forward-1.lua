--[[ export_forward: save a shard's export position, forward only (a stalled export's older
position is never saved over a later one).

KEYS[1] positions HASH    shard number -> id of the last journal entry exported

ARGV[1] shard number
ARGV[2] the entry id exported up to
ARGV[3] a position it may replace though that is past ARGV[2] ("" for none: a journal
        made again below it, journal_lost_after)

Ids are compared as digits, which Lua's numbers cannot hold; a stored value that is no id
is replaced. Returns 1 when saved, 0 when a later position was kept.
]]
local function before(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if not am or not bm then return true end
  if #am ~= #bm then return #am < #bm end
  if am ~= bm then return am < bm end
  if #as ~= #bs then return #as < #bs end
  return as < bs
end
local saved = redis.call('HGET', KEYS[1], ARGV[1])
if saved and saved ~= ARGV[3] and not before(saved, ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
