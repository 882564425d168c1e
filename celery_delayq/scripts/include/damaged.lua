-- damaged(checks): an error message naming the first key of this call that holds the
-- wrong type of value, or a journal that can take no more entries, or nil.
-- checks = {key index, type, key index, type, ...}; a missing key ('none') is fine.
-- Scripts call it before their first write, so a damaged key stops only its own shard
-- and nothing is removed before the operation can succeed. A stream is the shard's
-- journal, which ARGV[1] turns on (journal.lua): one whose last id is the largest there
-- is (set by hand: XADD or XSETID) would refuse the event after the script's writes.
local LAST_STREAM_ID = '18446744073709551615-18446744073709551615'
local function exhausted(n)
  local info = redis.call('XINFO', 'STREAM', KEYS[n])
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then return info[i + 1] == LAST_STREAM_ID end
  end
end
local function damaged(checks)
  for i = 1, #checks, 2 do
    local found = redis.call('TYPE', KEYS[checks[i]]).ok
    if found ~= checks[i + 1] and found ~= 'none' then
      return 'DAMAGED ' .. KEYS[checks[i]] .. ' holds a ' .. found .. ', not a '
        .. checks[i + 1]
    end
    if found == 'stream' and tonumber(ARGV[1]) > 0 and exhausted(checks[i]) then
      return 'DAMAGED ' .. KEYS[checks[i]] .. ' has no stream id left (its last id is '
        .. LAST_STREAM_ID .. ', the largest there is)'
    end
  end
end
