--[[ own: take, renew or release a carrier's lease on one shard.

KEYS[1] owner     STRING  id of the carrier serving the shard (expires with its lease)

ARGV[1] carrier id
ARGV[2] lease in ms
ARGV[3] "1" to hold the shard (take it when free, renew it when ours), "0" to release it

Returns 1 when the carrier holds the shard after the call, 0 otherwise.
]]
local owner = redis.call('GET', KEYS[1])
if ARGV[3] == '1' then
  if owner == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 1
  end
  if not owner then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return 1
  end
  return 0
end
if owner == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
