"""What `celery -A tasks inspect active_queues` (and Flower, which asks the same) shows of
workers on two hosts: each node by NAME@HOST, with the lanes it consumes. Real workers
(threads pool, no engine) against the suite's Redis; their hosts are named, not real."""

import pytest
from celery.contrib.testing.worker import start_worker
from celery.utils.nodenames import host_format

from tailguard.jobs.liveness import host_of, node_name
from tasks import app

pytestmark = pytest.mark.integration


def active_queues_of(node: str, queues: list[str]) -> dict[str, list[str]]:
    """Start a worker named `node` on `queues` and ask it, as `inspect active_queues` does.
    (One at a time: two test workers in one process share Celery's global worker state and
    do not stop cleanly.)"""
    with start_worker(app, pool="threads", concurrency=1, queues=queues, hostname=node,
                      perform_ping_check=False, loglevel="WARNING", shutdown_timeout=30):
        for _ in range(10):  # the node answers once its consumer is up
            replies = app.control.inspect(destination=[node], timeout=1).active_queues()
            if replies:
                return {n: [q["name"] for q in qs] for n, qs in replies.items()}
    raise AssertionError(f"{node} never answered inspect active_queues")


def test_active_queues_names_each_lane_per_host(redis_client_noflush):
    lanes_per_node = {**active_queues_of(host_format(node_name("short"), host="gpu-a"), ["short"]),
                      **active_queues_of(host_format(node_name("long"), host="gpu-b"),
                                         ["long", "batch"])}
    assert lanes_per_node == {"short@gpu-a": ["short"], "long@gpu-b": ["long", "batch"]}
    assert {host_of(node) for node in lanes_per_node} == {"gpu-a", "gpu-b"}
