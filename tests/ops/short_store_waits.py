"""Settings of a spawned worker whose store's Redis a test stalls (``celery --config
tests.ops.short_store_waits``): no retry, so one write to a stalled Redis waits one socket
timeout, most of the resend window (``connection.resend_window_ms``: 7 s here, 24 s by
default)."""

delayq_redis_socket_timeout = 6.0
delayq_redis_retries = 0
