-- kept(job_id): the jobs hash field that keeps the envelope of the copy of job_id a carrier
-- holds, while a later call of that id stands in its place (keys.py, invariant 8). Job ids
-- never hold control characters, so no job id is such a field.
local function kept(job_id)
  return '\1' .. job_id
end
