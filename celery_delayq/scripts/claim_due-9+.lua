--[[ claim_due: take up to a batch of due jobs of one shard, earliest first.

"Due" is due within the hand-off lead (ARGV[9], delayq_handoff_lead): a job promoted
ahead of its time carries its due time as eta, and the worker's timer starts it then.

A job is either claimed, moved from due to inflight under a lease (the carrier publishes
it through kombu, then acks it), or, with direct promotion, pushed here and now onto its
queue's list in the broker (the same Redis) as the message apply_async would send, and
forgotten as ack forgets it: exactly once, with no round trip per job.

Direct promotion takes a job whose envelope's first line holds only the fields t, i, y
and q, and options of ignore_result alone (no other options, headers, properties or
exchange) and whose queue is one of those
passed. Args and kwargs go into the body verbatim: cjson never re-encodes user data.

KEYS[1]   due       ZSET  job id -> due ms
KEYS[2]   inflight  ZSET  job id -> lease deadline ms
KEYS[3]   jobs      HASH  job id -> envelope; leasing an id again drops its kept(job id)
                          field (kept.lua): the earlier lease is over
KEYS[4]   bykey     ZSET  business-key index
KEYS[5]   journal   STREAM
KEYS[6]   counts    HASH  task name -> jobs stored (pending or being promoted)
KEYS[7]   paused    HASH  "task:<name>" / "queue:<name>" -> who paused it (pausing.py)
KEYS[8]   limits    HASH  "rate:<queue>" -> "<capacity> <refill per ms> <spec>" or "off",
                          "bucket:<queue>" -> "<tokens> <ms>" (ratelimit.py)
KEYS[9]   waiting   ZSET  "<queue>\0<due>\0<job id>" (score 0): the jobs rate limits hold,
                          in the order each queue's go (held.lua: waiting_member)
KEYS[10..] the broker's message list of each queue open to direct promotion (none: off)

ARGV[1]   journal maxlen (0: no journal)
ARGV[2]   batch size
ARGV[3]   lease in ms
ARGV[4]   shard number (the delayq_shard header)
ARGV[5]   origin header (the promoting carrier)
ARGV[6]   longest argsrepr / kwargsrepr header, in bytes
ARGV[7]   the default queue (of envelopes that name none)
ARGV[8]   delayq_max_nesting: args and kwargs with more brackets than this are claimed
          (the carrier decodes them; too deep, they are dead-lettered, never pushed)
ARGV[9]   the hand-off lead in ms (0: jobs are taken once due)
ARGV[10]  delayq_max_payload_bytes: a longer envelope is claimed (the carrier dead-letters
          it, never pushed)
ARGV[11..] two values per KEYS[10..], in the same order: queue name, delivery mode

Returns {now ms, next due ms or -1, {due ms of each job promoted directly}, lease,
         {job id, task id, ... of the jobs promoted directly whose task id is not their
         job id: the carrier forgets their task id indexes (unindex)},
         id1, due1, envelope1 or nil, id2, ...} where the ids are the claimed jobs and
lease is their in-flight score as text: the deadline with this call's microseconds as
decimals, a token ack / recover / dead check, so an old copy's ack never takes the lease
of the same id claimed again (after a replace) by this or another call.
Job ids are stored packed (keys.pack_id); messages carry them unpacked.
The next due time is when the earliest job left on the due set can be taken, or sooner when a
rate-limited queue has jobs waiting: when its bucket holds its next whole token.

Held jobs (held.py) stay pending and the claim goes on past them: a due job of a paused
task or queue gets the score PAUSED_BASE + due. A due job of a rate-limited queue is taken
while the queue's token bucket has a whole token and no older job of it waits; else it
gets the score RATE_BASE + due and joins the waiting set. A queue's waiting jobs are taken
first, oldest first, as tokens come (a member whose job was cancelled, rescheduled or
replaced since, so whose score is not RATE_BASE + its due any more, is dropped).

Fails with "DAMAGED <key> holds a <type>, not a <type>", writing nothing, when one of
its keys holds the wrong type of value.
]]
-- include: counts.lua
-- include: damaged.lua
-- include: held.lua
-- include: journal.lua
-- include: kept.lua
-- include: now.lua
local problem = damaged({1, 'zset', 2, 'zset', 3, 'hash', 4, 'zset', 5, 'stream', 6, 'hash',
                         7, 'hash', 8, 'hash', 9, 'zset'})
if problem then return redis.error_reply(problem) end
local now, t = now_ms()
local now_us = t[1] .. string.format('%06d', tonumber(t[2]))
local repr_max = tonumber(ARGV[6])
local max_nesting = tonumber(ARGV[8])
local max_payload = tonumber(ARGV[10])

local routes = {}
for n = 10, #KEYS do
  local found = redis.call('TYPE', KEYS[n]).ok
  if found == 'list' or found == 'none' then  -- a damaged queue list: those jobs are claimed
    routes[ARGV[2 * n - 9]] = {index = n, mode = tonumber(ARGV[2 * n - 8])}
  end
end
local paused = {}
local flat = redis.call('HGETALL', KEYS[7])
for i = 1, #flat, 2 do paused[flat[i]] = true end
-- The rate-limited queues of this shard: queue -> {capacity, refill per ms, tokens now}.
local limits = {}
flat = redis.call('HGETALL', KEYS[8])
for i = 1, #flat, 2 do
  local queue = string.match(flat[i], '^rate:(.*)$')
  local capacity, refill = string.match(flat[i + 1], '^(%S+) (%S+)')
  capacity, refill = tonumber(capacity), tonumber(refill)
  -- (a damaged value, as "off", limits nothing)
  if queue and capacity and refill and capacity >= 1 and capacity < 1e12 and refill > 0
      and refill < 1e9 then
    limits[queue] = {capacity = capacity, refill = refill, tokens = capacity, name = queue}
  end
end
for i = 1, #flat, 2 do
  local queue = string.match(flat[i], '^bucket:(.*)$')
  local tokens, at = string.match(flat[i + 1], '^(%S+) (%S+)')
  tokens, at = tonumber(tokens), tonumber(at)
  local limit = queue and limits[queue]
  if limit and tokens and at and tokens == tokens and at == at then  -- (not NaN)
    limit.tokens = math.max(math.min(limit.capacity,
                                     tokens + math.max(now - at, 0) * limit.refill), 0)
  end
end
local controlled = next(paused) ~= nil or next(limits) ~= nil
local facts = {}  -- first line -> {held by a pause, its queue's limit or false}
-- What holds a job back: "paused", its queue's limit (a table), or nil. Only for a
-- readable due time: a damaged one is claimed, and the carrier dead-letters it.
local function control(env, due)
  if not controlled or not env then return nil end
  local d = tonumber(due)
  if not d or d < MIN_DUE or d > MAX_DUE then return nil end
  local line = string.match(env, '^[^\n]*')
  local found = facts[line]
  if found == nil then
    local task, queue = first_fields(line, ARGV[7])
    found = {task and held_by(paused, task, queue), task and limits[queue] or false}
    facts[line] = found
  end
  if found[1] then return 'paused' end
  return found[2] or nil
end

local function repr(text)
  if #text <= repr_max then return text end
  local cut = repr_max - 3
  while cut > 0 and string.byte(text, cut + 1) >= 128 and string.byte(text, cut + 1) < 192 do
    cut = cut - 1  -- never split a UTF-8 sequence
  end
  return string.sub(text, 1, cut) .. '...'
end

-- What a job's first line says, when it is open to direct promotion: its fields and the
-- parts of its message that depend on them alone; false when it is not.
local IGNORED = {[true] = 'true', [false] = 'false', [cjson.null] = 'null'}
local function route(line)
  if string.find(line, '[%z\1-\31]') then return false end  -- raw: Python's JSON refuses it
  local fields = first_line(line)
  if not fields or type(fields['t']) ~= 'string' or fields['t'] == '' then return false end
  local ignore = 'null'  -- the message's ignore_result: the call's own, else the task's
  for name, value in pairs(fields) do
    if name == 'o' and type(value) == 'table' then  -- options: ignore_result alone
      for option, given in pairs(value) do
        if option ~= 'ignore_result' or not IGNORED[given] then return false end
        ignore = IGNORED[given]
      end
    elseif type(value) ~= 'string' or not (name == 't' or name == 'i' or name == 'y'
                                           or name == 'q') then
      return false
    end
  end
  local name = fields['q'] or ARGV[7]
  local queue = routes[name]
  if not queue then return false end
  return {
    fields = fields, index = queue.index, ignore = ignore,
    id = fields['i'] and cjson.encode(fields['i']),
    task = cjson.encode(fields['t']),
    key = (fields['y'] or '') ~= '' and (',"delayq_key":' .. cjson.encode(fields['y'])) or '',
    properties = ',"reply_to":"","delivery_mode":' .. queue.mode
      .. ',"delivery_info":{"exchange":"","routing_key":' .. cjson.encode(name)
      .. '},"priority":0,"delivery_tag":',
  }
end

-- True when text is valid UTF-8 (what Python decodes): every well-formed sequence of two
-- to four bytes replaced by an ASCII byte, no byte of 128 or more is left (removing them
-- would join the bytes around one into a sequence: E0 A0 [C2 80] 80).
local UTF8 = {
  '[\194-\223][\128-\191]', '\224[\160-\191][\128-\191]',
  '[\225-\236\238\239][\128-\191][\128-\191]', '\237[\128-\159][\128-\191]',
  '\240[\144-\191][\128-\191][\128-\191]', '[\241-\243][\128-\191][\128-\191][\128-\191]',
  '\244[\128-\143][\128-\191][\128-\191]',
}
local function utf8(text)
  if not string.find(text, '[\128-\255]') then return true end  -- ASCII, as producers write
  for _, sequence in ipairs(UTF8) do text = string.gsub(text, sequence, '.') end
  return not string.find(text, '[\128-\255]')
end

-- Whether a number outside the strings of this JSON text has a leading zero (cjson reads
-- 01, Python's JSON refuses it); the strings are left out only when the text has the
-- pattern at all (an ISO time holds ":05").
local function leading_zero(text)
  if not string.find(text, '[%[,:]%s*-?0%d') then return false end
  local bare = string.gsub(string.gsub(text, '\\.', ''), '"[^"]*"', '""')
  return string.find(bare, '[%[,:]%s*-?0%d') ~= nil
end

-- False when a worker might not decode these args and kwargs lines (producers never write
-- such lines; the carrier decodes what this passes over and dead-letters what it must):
-- not an array and an object, a NaN / Infinity token, a number with a leading zero (cjson
-- reads 01, Python's JSON refuses it), digits past Python's 4,300 limit for
-- an int, more brackets than delayq_max_nesting (maybe nested too deeply), a "__type__" key
-- (kombu's JSON object for a datetime, UUID ..., which may hold what kombu cannot decode),
-- a control character (a line break: a line past the envelope's three; another: Python's
-- JSON refuses one raw in a string, producers escape them), text cjson cannot decode.
local function decodable(args, kwargs)
  if args ~= '' and (string.byte(args, 1) ~= 91 or string.byte(args, -1) ~= 93) then
    return false  -- not [ ... ]
  end
  if kwargs ~= '' and (string.byte(kwargs, 1) ~= 123 or string.byte(kwargs, -1) ~= 125) then
    return false  -- not { ... }
  end
  local text = args .. kwargs
  if string.find(text, '[%[,:]%s*-?[NI]') or leading_zero(text)
     or string.find(text, '"__type__"', 1, true) or string.find(text, '[%z\1-\31]') then
    return false
  end
  if #text > max_nesting and select(2, string.gsub(text, '[%[{]', '')) > max_nesting then
    return false
  end
  if #text > 4300 then
    for digits in string.gmatch(text, '%d+') do
      if #digits > 4300 then return false end
    end
  end
  return (args == '' or decoded(args) ~= nil) and (kwargs == '' or decoded(kwargs) ~= nil)
end

-- The route of a job open to direct promotion and its raw args and kwargs, else nil.
-- Envelopes that are not UTF-8 or longer than delayq_max_payload_bytes are claimed instead,
-- so the carrier dead-letters them rather than pushing them to a worker; so is a job whose
-- due time is not a whole, finite number (NaN fails the comparison with its floor), which
-- the carrier publishes or dead-letters as it does through kombu.
local routed = {}  -- first line -> route (the jobs of a batch share a few first lines)
local function plain(job_id, env, due)
  if not env or next(routes) == nil or #env > max_payload or not utf8(env)
     or not utf8(job_id) then
    return nil
  end
  local d = tonumber(due)
  if not d or d ~= math.floor(d) or d == math.huge or d == -math.huge then return nil end
  local nl1 = string.find(env, '\n', 1, true)
  local nl2 = nl1 and string.find(env, '\n', nl1 + 1, true)
  if not nl2 then return nil end
  local line = string.sub(env, 1, nl1 - 1)
  local r = routed[line]
  if r == nil then
    r = route(line)
    routed[line] = r
  end
  if not r then return nil end
  local args, kwargs = string.sub(env, nl1 + 1, nl2 - 1), string.sub(env, nl2 + 1)
  if not decodable(args, kwargs) then return nil end
  return r, args, kwargs
end

-- The job id keys.pack_id stored as "~" + 21 base64url characters: the 31 hex digits of a
-- version-4 UUID other than its version digit, then 2 zero bits.
local SIXTY_FOUR = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'
local HEX = {}
for n = 0, 15 do HEX[n] = string.format('%x', n) end
-- Per character (byte) of SIXTY_FOUR, for its 6 bits: the hex digit of the top 4, the hex
-- digit of the low 4, the low 2 shifted up to be a digit's top 2, the top 2 as a digit's low 2.
local HIGH, LOW, LOW2, TOP2 = {}, {}, {}, {}
for n = 1, 64 do
  local char, bits = string.byte(SIXTY_FOUR, n), n - 1
  HIGH[char], LOW[char] = HEX[math.floor(bits / 4)], HEX[bits % 16]
  LOW2[char], TOP2[char] = (bits % 4) * 4, math.floor(bits / 16)
end
-- Returns whether it was a UUID, and the id: as keys.unpack_id, a damaged id that starts
-- with one "~" but is not "~" and 21 base64url characters comes back as it is.
local function unpack_id(stored)
  if string.byte(stored, 1) ~= 126 then return false, stored end  -- not "~"
  if string.byte(stored, 2) == 126 then return false, string.sub(stored, 2) end
  if #stored ~= 22 or string.find(stored, '[^%w_%-]', 2) then return false, stored end
  -- two characters, 12 bits, make three hex digits: a b -> HIGH[a], HEX[LOW2[a] + TOP2[b]],
  -- LOW[b]; the last character's low 2 bits are padding. One concatenation, no tables.
  local a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p, q, r, s, t, u = string.byte(stored, 2, 22)
  return true, HIGH[a] .. HEX[LOW2[a] + TOP2[b]] .. LOW[b] .. HIGH[c] .. HEX[LOW2[c] + TOP2[d]]
    .. LOW[d] .. HIGH[e] .. HEX[LOW2[e] + TOP2[f]] .. '-' .. LOW[f] .. HIGH[g]
    .. HEX[LOW2[g] + TOP2[h]] .. LOW[h] .. '-4' .. HIGH[i] .. HEX[LOW2[i] + TOP2[j]] .. LOW[j]
    .. '-' .. HIGH[k] .. HEX[LOW2[k] + TOP2[l]] .. LOW[l] .. HIGH[m] .. '-'
    .. HEX[LOW2[m] + TOP2[n]] .. LOW[n] .. HIGH[o] .. HEX[LOW2[o] + TOP2[p]] .. LOW[p] .. HIGH[q]
    .. HEX[LOW2[q] + TOP2[r]] .. LOW[r] .. HIGH[s] .. HEX[LOW2[s] + TOP2[t]] .. LOW[t] .. HIGH[u]
end

-- The eta header of a job due at ms, as message.eta_header writes it: the due time, UTC, to
-- the millisecond; null outside years 1 to 9999 (days to a date: Hinnant's civil_from_days).
-- Returned in parts that message() joins, so a job's eta makes no string of its own: the
-- date and time to the second (the same for the jobs of a second), then its three digits
-- of milliseconds.
local second_text = {}  -- second -> '"<date>T<time>.'; a batch falls due in a few seconds
local DIGIT = {}
for n = 0, 9 do DIGIT[n] = tostring(n) end
local function eta(due)
  local ms = math.floor(tonumber(due))
  if ms < -62135596800000 or ms > 253402300799999 then return 'null', '', '', '', '' end
  local second = math.floor(ms / 1000)
  local text = second_text[second]
  if not text then
    local days = math.floor(second / 86400)
    local rest = second - days * 86400
    local z = days + 719468
    local era = math.floor(z / 146097)
    local doe = z - era * 146097
    local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
                            - math.floor(doe / 146096)) / 365)
    local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
    local mp = math.floor((5 * doy + 2) / 153)
    local month = mp < 10 and mp + 3 or mp - 9
    text = string.format('"%04d-%02d-%02dT%02d:%02d:%02d.', yoe + era * 400
      + (month <= 2 and 1 or 0), month, doy - math.floor((153 * mp + 2) / 5) + 1,
      math.floor(rest / 3600), math.floor(rest / 60) % 60, rest % 60)
    second_text[second] = text
  end
  local milli = ms - second * 1000
  return text, DIGIT[math.floor(milli / 100)], DIGIT[math.floor(milli / 10) % 10],
    DIGIT[milli % 10], '+00:00"'
end

-- Text as the inside of a JSON string: as it is when nothing in it needs escaping (JSON of
-- numbers, lists and objects; no quote, backslash or control character), else escaped.
local function inside(text)
  if not string.find(text, '[%c"\\]') then return text end
  return string.sub(cjson.encode(text), 2, -2)
end

-- The kombu Redis transport's message for Celery's protocol 2, as apply_async sends it
-- (Celery's headers and properties; the body is JSON text, not base64). One concatenation:
-- the parts that are the same for every job of a call are constants or kept per route.
local EMBED = [[,{\"callbacks\":null,\"errbacks\":null,\"chain\":null,\"chord\":null}]"]]
  .. ',"content-encoding":"utf-8","content-type":"application/json","headers":{'
  .. '"lang":"py","task":'
local AFTER_KWARGSREPR = '","origin":' .. cjson.encode(ARGV[5]) .. ',"ignore_result":'
local AFTER_IGNORE = ',"replaced_task_nesting":0,"stamped_headers":null,"stamps":{},"delayq_job":"'
local AFTER_JOB = '","delayq_shard":' .. ARGV[4] .. ',"delayq_due":'
local function message(stored, due, r, args, kwargs)
  local uuid, job_id = unpack_id(stored)
  local job = uuid and job_id or inside(job_id)  -- inside its JSON string
  local id = r.id or ('"' .. job .. '"')
  if args == '' then args = '[]' end
  if kwargs == '' then kwargs = '{}' end
  local a, k = inside(args), inside(kwargs)
  local eta1, eta2, eta3, eta4, eta5 = eta(due)
  return '{"body":"[' .. a .. ',' .. k .. EMBED .. r.task .. ',"id":' .. id
    .. ',"shadow":null,"eta":' .. eta1 .. eta2 .. eta3 .. eta4 .. eta5
    .. ',"expires":null,"group":null,"group_index":null,"retries":0,'
    .. '"timelimit":[null,null],"root_id":' .. id .. ',"parent_id":null,"argsrepr":"'
    .. (#args <= repr_max and a or inside(repr(args))) .. '","kwargsrepr":"'
    .. (#kwargs <= repr_max and k or inside(repr(kwargs))) .. AFTER_KWARGSREPR .. r.ignore
    .. AFTER_IGNORE .. job
    .. AFTER_JOB .. due .. r.key .. '},"properties":{"correlation_id":' .. id
    .. r.properties .. '"' .. job .. '@' .. now_us .. '"}}'
end

-- Runs redis.call(command, key, ...) with many values, a thousand at a time; the replies
-- of a command that returns one per value, in order.
local function each_chunk(command, key, values)
  local replies = {}
  for first = 1, #values, 1000 do
    local reply = redis.call(command, key, unpack(values, first, math.min(first + 999, #values)))
    if type(reply) == 'table' then
      for k = 1, #reply do replies[first + k - 1] = reply[k] end
    end
  end
  return replies
end

-- Holds a job back when a pause or its queue's rate limit says so (see the header);
-- true when it did. A job of a limited queue that may go takes a token.
local function held_back(job_id, due, env, is_fresh)
  local rule = control(env, due)
  if rule == 'paused' then
    redis.call('ZADD', KEYS[1], PAUSED_BASE + tonumber(due), job_id)
    return true
  end
  if not rule then return false end
  if rule.tokens >= 1 and not (is_fresh and rule.waiting) then
    rule.tokens = rule.tokens - 1
    return false
  end
  redis.call('ZADD', KEYS[1], RATE_BASE + tonumber(due), job_id)
  redis.call('ZADD', KEYS[9], 0, waiting_member(rule.name, due, job_id))
  rule.waiting = true
  return true
end

-- The jobs to look at: first the waiting jobs of each limited queue its tokens allow,
-- oldest first, then the due jobs.
local batch = tonumber(ARGV[2])
local names, dues, fresh = {}, {}, {}
for queue, limit in pairs(limits) do
  local first, last = '[' .. queue .. '\0', '(' .. queue .. '\1'
  local take = math.min(math.floor(limit.tokens), batch)
  if take >= 1 then
    for _, member in ipairs(redis.call('ZRANGEBYLEX', KEYS[9], first, last, 'LIMIT', 0, take)) do
      redis.call('ZREM', KEYS[9], member)
      local due, job_id = waiting_job(member)
      if due and tonumber(redis.call('ZSCORE', KEYS[1], job_id)) == RATE_BASE + due then
        redis.call('ZREM', KEYS[1], job_id)
        names[#names + 1], dues[#dues + 1], fresh[#fresh + 1] = job_id, due, false
      end
    end
  end
  limit.waiting = redis.call('ZLEXCOUNT', KEYS[9], first, last) > 0
end
local lead = tonumber(ARGV[9])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now + lead, 'WITHSCORES', 'LIMIT', 0,
                       batch)
if #ids > 0 then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #ids / 2 - 1) end
for i = 1, #ids, 2 do
  names[#names + 1], dues[#dues + 1], fresh[#fresh + 1] = ids[i], ids[i + 1], true
end

local direct = {}
local lease = string.format('%.3f', now + tonumber(ARGV[3]) + tonumber(t[2]) % 1000 / 1000)
local indexed = {}
local out = {now, -1, direct, lease, indexed}
local pushed, forgotten, unkeyed, per_task = {}, {}, {}, {}
if #names > 0 then
  local envelopes = each_chunk('HMGET', KEYS[3], names)
  for n, job_id in ipairs(names) do
    local due, env = dues[n], envelopes[n]
    if not held_back(job_id, due, env, fresh[n]) then
      local r, args, kwargs = plain(job_id, env, due)
      if r then
        local fields = r.fields
        local queue = r.index
        pushed[queue] = pushed[queue] or {}
        table.insert(pushed[queue], message(job_id, due, r, args, kwargs))
        forgotten[#forgotten + 1] = job_id
        per_task[fields['t']] = (per_task[fields['t']] or 0) + 1
        local key = fields['y'] or ''
        if key ~= '' then unkeyed[#unkeyed + 1] = key .. '\0' .. job_id end
        journal_batch(5, 'promoted', 'job', job_id, 'task', fields['t'], 'key', key, 'due', due)
        direct[#direct + 1] = tonumber(due)
        if fields['i'] then
          indexed[#indexed + 1] = job_id
          indexed[#indexed + 1] = fields['i']
        end
      else
        if redis.call('ZADD', KEYS[2], lease, job_id) == 0 then  -- leased again
          redis.call('HDEL', KEYS[3], kept(job_id))
        end
        out[#out + 1] = job_id
        out[#out + 1] = due
        out[#out + 1] = env
      end
    end
  end
end
for index, messages in pairs(pushed) do each_chunk('LPUSH', KEYS[index], messages) end
each_chunk('HDEL', KEYS[3], forgotten)
each_chunk('ZREM', KEYS[4], unkeyed)
for task, n in pairs(per_task) do add_count(6, task, -n) end
if #direct > 0 then trim_journal(5) end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local next_due = head[2] and tonumber(head[2])
-- (a damaged score past year 30,000 reads as never due: Redis replies integers only)
if next_due and next_due < 1e15 then out[2] = math.max(next_due - lead, now) end
for queue, limit in pairs(limits) do
  redis.call('HSET', KEYS[8], 'bucket:' .. queue, string.format('%.6f %d', limit.tokens, now))
  if limit.waiting then  -- come back when the bucket holds a whole token
    local at = now + math.ceil(math.max(1 - limit.tokens, 0) / limit.refill)
    if out[2] == -1 or at < out[2] then out[2] = at end
  end
end
return out
