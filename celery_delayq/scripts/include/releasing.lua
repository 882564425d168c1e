-- include: now.lua
-- A release under way on this shard (release-6.lua), in the releasing hash: field
-- "paused" (after a resume) or "rate:<queue>" (after a rate limit's removal) ->
-- "<token> <ms> <where>": the token of the resume or removal that began it, when its
-- walk last went on (Redis clock), and where it goes on ("<score> <job id>", or "").
-- note_release(n, field, token, where) writes one in KEYS[n], gone on just now ("" where:
-- it begins, from the first held job).
local function note_release(n, field, token, where)
  redis.call('HSET', KEYS[n], field, token .. ' ' .. now_ms() .. ' ' .. where)
end
