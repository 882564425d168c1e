"""Settings of a spawned worker of an app on pickle (``celery --config
tests.faults.pickle_worker``): the store takes JSON only, so it refuses every delayed call
this worker's tasks make."""

task_serializer = "pickle"
accept_content = ["json", "pickle"]
