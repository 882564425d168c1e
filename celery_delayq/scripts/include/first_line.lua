-- decoded(text): the value of a JSON text, or nil when cjson cannot decode it.
local function decoded(text)
  local ok, value = pcall(cjson.decode, text)
  if ok then return value end
  return nil
end
-- first_line(text): the fields of an envelope's first line (t task name, i task id,
-- y business key, q queue, ...: see envelope.py), or nil when there is no text or that
-- line is not a JSON object. Text without a newline is read as a first line itself.
local function first_line(text)
  local fields = decoded(string.match(text or '', '^[^\n]*'))
  if type(fields) == 'table' then return fields end
  return nil
end
-- text_field(fields, name): that field when it is text, else '' (in a damaged envelope it
-- may be a number, list or object: no name, and no argument a Redis command takes).
local function text_field(fields, name)
  local value = fields and fields[name]
  return type(value) == 'string' and value or ''
end
