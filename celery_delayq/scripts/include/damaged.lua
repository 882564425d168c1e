-- damaged(checks): an error message naming the first key of this call that holds the
-- wrong type of value, or nil. checks = {key index, type, key index, type, ...}; a missing
-- key ('none') is fine. Scripts call it before their first write, so a damaged key stops
-- only its own shard and nothing is removed before the operation can succeed.
local function damaged(checks)
  for i = 1, #checks, 2 do
    local found = redis.call('TYPE', KEYS[checks[i]]).ok
    if found ~= checks[i + 1] and found ~= 'none' then
      return 'DAMAGED ' .. KEYS[checks[i]] .. ' holds a ' .. found .. ', not a '
        .. checks[i + 1]
    end
  end
end
