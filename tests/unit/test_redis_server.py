"""The test-server helper picks ports a redis-server can really use."""

from __future__ import annotations

from celery_delayq.testing.redis_server import free_port


def test_cluster_node_ports_leave_room_for_the_bus_port():
    # redis-server refuses cluster mode above 55535: its bus listens on port + 10000
    assert all(free_port(cluster_node=True) <= 55_535 for _ in range(200))
