"""celeryconfig.py: JSON only, late acks, one queue and route per lane, limits per lane."""

import subprocess
import sys

from conftest import ROOT

import celeryconfig
from tailguard.lanes.table import load_lanes


def test_module_runs_cleanly():
    out = subprocess.run([sys.executable, "-m", "celeryconfig"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert "queue short" in out and "visibility_timeout=" in out


def test_json_only_and_late_acks():
    assert celeryconfig.accept_content == ["json"]
    assert celeryconfig.task_serializer == celeryconfig.result_serializer == "json"
    assert celeryconfig.task_acks_late is True
    assert celeryconfig.worker_prefetch_multiplier == 1
    assert celeryconfig.worker_pool == "threads"
    assert celeryconfig.worker_send_task_events is True


def test_queues_routes_and_limits_follow_the_lanes():
    lanes = load_lanes()
    assert [q.name for q in celeryconfig.task_queues] == lanes.names
    for lane in lanes:
        assert celeryconfig.task_routes[lane.task_name] == {"queue": lane.name}
        ann = celeryconfig.task_annotations[lane.task_name]
        assert ann["rate_limit"] == (lane.rate_limit or None)
        assert ann["soft_time_limit"] == lane.deadline_s
    vt = celeryconfig.broker_transport_options["visibility_timeout"]
    assert vt > lanes.max_visibility_s
    assert celeryconfig.broker_transport_options["queue_order_strategy"] == "priority"


def test_kombus_brpop_returns_within_a_tenth_of_a_second():
    # a lane the gate opens again is read only once the BRPOP in flight returns
    # (tailguard/worker/lane_gate.py): the option must reach kombu's Redis transport
    from kombu import Connection

    conn = Connection("redis://127.0.0.1:1/0",
                      transport_options=celeryconfig.broker_transport_options)
    assert conn.transport.brpop_timeout == 0.1


def test_tasks_app_registers_one_task_per_lane():
    from tasks import app

    app.loader.import_default_modules()
    names = {t for t in app.tasks if t.startswith("tailguard.generate.")}
    assert names == {lane.task_name for lane in load_lanes()}
    assert app.tasks["tailguard.generate.long"].rate_limit == "50/s"  # from tests/lanes.test.toml


def test_engine_stats_is_known_to_the_celery_cli():
    out = subprocess.run([sys.executable, "-m", "celery", "-A", "tasks", "inspect", "--list"],
                         cwd=ROOT, capture_output=True, text=True).stdout
    assert "engine_stats" in out
