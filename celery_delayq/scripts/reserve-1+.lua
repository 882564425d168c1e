--[[ reserve: a producer scheduling job ids of its own choosing holds a reservation of each
on the id's own shard meanwhile, so producers scheduling one id under business keys of
different shards go one after the other, and each sees what the one before it stored.

KEYS[1]   a reservation key, one per job id (KEYS[2..]: more, all of one shard)

ARGV[1] "take" or "release"
ARGV[2] the producer's token (random, one per schedule call)
ARGV[3] take: ms after which a reservation ends by itself (its producer died)

Returns, for take: 1 when every key is now held for the token, 0 when another token holds
one (then none was taken); for release: how many of the keys the token held it deleted.
]]
if ARGV[1] == 'take' then
  for i = 1, #KEYS do
    local holder = redis.call('GET', KEYS[i])
    if holder and holder ~= ARGV[2] then return 0 end
  end
  for i = 1, #KEYS do redis.call('SET', KEYS[i], ARGV[2], 'PX', ARGV[3]) end
  return 1
end
local released = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[2] then released = released + redis.call('DEL', KEYS[i]) end
end
return released
