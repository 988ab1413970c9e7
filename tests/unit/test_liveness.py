"""Worker names as Celery gives them (name@host): which host a worker counts for."""

import pytest

from tailguard.jobs.liveness import host_of


@pytest.mark.parametrize("worker,host", [
    ("short@gpu-host-2", "gpu-host-2"),
    ("short@ns1", "ns1"),
    ("a@b@c", "c"),            # Celery's %h never has '@'; the host is what follows the last
    ("bare-name", "bare-name"),  # not a Celery name: its own host
])
def test_host_is_what_follows_the_at(worker, host):
    assert host_of(worker) == host
