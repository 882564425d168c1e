-- now_ms(): Redis's clock (TIME) in ms, the clock of every due time; and TIME's reply,
-- {seconds, microseconds}.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end
