"""Engines' running requests from their own vLLM series, and refusals made while one of them had a
free slot (tailguard/bench/engine_watch.py)."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from tailguard.bench.engine_watch import (
    PREFIX_HITS,
    PREFIX_QUERIES,
    RUNNING,
    STEPS,
    SUCCESS,
    WAITING,
    EngineWatch,
    free_slot_evidence,
    held,
    parse_series,
    prefix_delta,
    prefix_hit_rate,
    running_at,
)
from tailguard.bench.loadgen import REFUSED, Sample


def vllm_page(running: dict[str, float], success: dict[str, float],
              prefix: tuple[float, float] | None = None, waiting: float = 0) -> str:
    """A /metrics page as vLLM's PrometheusStatLogger writes it: a series per engine, the
    success counter per finish reason, and with `prefix` its prefix cache's (queries, hits)."""
    reg = CollectorRegistry()
    if prefix is not None:
        for name, n in zip((PREFIX_QUERIES, PREFIX_HITS), prefix):
            Counter(name, "tokens", ["model_name", "engine"], registry=reg).labels("m", "0").inc(n)
    g = Gauge(RUNNING, "running", ["model_name", "engine"], registry=reg)
    for engine, n in running.items():
        g.labels("m", engine).set(n)
    c = Counter(SUCCESS, "done", ["model_name", "engine", "finished_reason"], registry=reg)
    for reason, n in success.items():
        c.labels("m", "0", reason).inc(n)
    Gauge(WAITING, "waiting", registry=reg).set(waiting)
    return generate_latest(reg).decode()


def test_parse_series_sums_each_engine_and_finish_reason():
    page = vllm_page({"0": 3, "1": 2}, {"length": 5, "stop": 2}, waiting=9)
    assert parse_series(page) == {RUNNING: 5.0, WAITING: 9.0, SUCCESS: 7.0}
    assert held(parse_series(page)) == 14.0 and held({RUNNING: 2.0}) == 2.0
    assert parse_series("") == {}
    with_prefix = parse_series(vllm_page({"0": 1}, {}, prefix=(1000, 250)))
    assert (with_prefix[PREFIX_QUERIES], with_prefix[PREFIX_HITS]) == (1000.0, 250.0)


def test_vllms_own_counter_names_are_the_ones_read():
    loggers = pytest.importorskip("vllm.v1.metrics.loggers")
    source = open(loggers.__file__).read()
    assert f'name="{PREFIX_QUERIES}"' in source and f'name="{PREFIX_HITS}"' in source
    assert f'name="{RUNNING}"' in source and f'name="{WAITING}"' in source


def test_a_prefix_delta_is_what_each_counter_grew_by():
    first = {PREFIX_QUERIES: 100.0, PREFIX_HITS: 40.0}
    assert prefix_delta(first, {PREFIX_QUERIES: 600.0, PREFIX_HITS: 290.0}) == {
        "queries": 500.0, "hits": 250.0}
    assert prefix_delta(None, first) is None and prefix_delta(first, None) is None
    assert prefix_delta({SUCCESS: 1.0}, first) is None  # a page without the counters


def test_a_topologys_hit_rate_sums_its_engines():
    got = prefix_hit_rate({"e0": {"queries": 600.0, "hits": 300.0},
                           "e1": {"queries": 400.0, "hits": 0.0}, "gone": None})
    assert got == {"queries": 1000.0, "hits": 300.0, "hit_rate": 0.3, "unread": ["gone"]}
    assert prefix_hit_rate({"e0": None})["hit_rate"] is None
    assert prefix_hit_rate({"e0": {"queries": 0.0, "hits": 0.0}})["hit_rate"] is None


def test_running_at_is_the_last_scrape_at_or_before():
    series = [[10.0, 1.0], [10.5, 4.0], [11.0, 0.0]]
    assert running_at(series, 9.9) is None
    assert [running_at(series, t) for t in (10.0, 10.4, 10.5, 10.9, 99)] == [1.0, 1.0, 4.0, 4.0, 0.0]
    assert running_at([], 10.0) is None


def refused(cls, *times, status=429):
    return Sample(cls, 8, 0.0, sent_s=0.0, status=REFUSED, http_status=status,
                  refused_at=list(times), attempts=len(times))


SERIES = {"a": [[0.0, 6.0], [5.0, 5.0], [8.0, 5.0], [10.0, 6.0]],  # 6 slots: one free 5-10
          "b": [[0.0, 8.0], [7.0, 2.0]]}               # 8 slots: full until 7
SLOTS = {"a": 6, "b": 8}


def free_slot_counts(samples, series, slots, class_engines=None):
    """Per class, how many requests the evidence names (what the report counts)."""
    return {cls: len(found) for cls, found in
            free_slot_evidence(samples, series, slots, class_engines).items()}


@pytest.mark.parametrize("sample, engines, counted", [
    (refused("short", 1.0), None, 0),              # every engine full
    (refused("short", 6.0), None, 1),              # a's slot is free
    (refused("short", 6.0), {"short": ["b"]}, 0),  # ...but only b may serve short
    (refused("short", 8.0), {"short": ["b"]}, 1),  # b has room from 7
    (refused("short", 9.0), {"short": ["a"]}, 0),  # a's slot full at the next scrape: taken
    (refused("short", 12.0), {"short": ["a"]}, 0),  # full since 10, no scrape after
    (refused("long", 6.0), {"short": ["b"]}, 1),   # a class not listed: every engine
    (refused("short", 1.0, 6.0), None, 1),         # any attempt's refusal counts once
    (refused("short", 6.0, 8.0), None, 1),
    (refused("short", -1.0), None, 0),             # before the first scrape: not known free
    (refused("short", 12.0, status=503), None, 1),  # a 503 as a 429 (b free since 7)
    (Sample("short", 8, 0.0, status="succeeded", ok=True), None, 0),
])
def test_free_slot_refusals(sample, engines, counted):
    assert free_slot_counts([sample], SERIES, SLOTS, engines) == {sample.cls: counted}


# with step counts: engine "a" (4 slots) shows 3 from 0.0 to 2.0 with a step of a second or
# more in flight; a job its worker took at 0.6 enters the scheduler at the next step
STEPPED = {"a": [[0.0, 3.0, 10.0], [0.5, 3.0, 10.0], [1.0, 3.0, 10.0], [2.0, 3.0, 11.0],
                 [3.0, 4.0, 12.0], [4.0, 3.0, 13.0], [5.0, 3.0, 14.0], [6.0, 3.0, 15.0]]}


@pytest.mark.parametrize("t, counted", [
    (0.7, 0),  # full two steps after the scrape before it: the slot was taken (the scrapes
               # just before and after, 0.5 and 1.0, both show it free)
    (1.5, 0),
    (3.5, 0),  # full at the scrape before
    (4.5, 1),  # free from 4.0 through two steps on (6.0)
    (5.5, 1),  # never two steps on: every later scrape free
])
def test_a_slot_is_free_only_while_the_gauges_show_it_two_steps_on(t, counted):
    assert free_slot_counts([refused("short", t)], STEPPED, {"a": 4}) == {"short": counted}


def test_the_evidence_names_the_engine_and_the_scrapes_that_show_its_slot_free():
    evidence = free_slot_evidence([refused("short", 1.0, 4.5)], STEPPED, {"a": 4})
    assert evidence == {"short": [{"refused_at": 4.5, "engine": "a", "slots": 4,
                                   "scrapes": [[4.0, 3.0, 13.0], [5.0, 3.0, 14.0], [6.0, 3.0, 15.0]]}]}
    assert free_slot_evidence([refused("short", 0.7)], STEPPED, {"a": 4}) == {"short": []}


def test_a_page_gives_a_histograms_count():
    page = ('# TYPE vllm:iteration_tokens_total histogram\n'
            'vllm:iteration_tokens_total_bucket{engine="0",le="+Inf"} 7.0\n'
            'vllm:iteration_tokens_total_sum{engine="0"} 500.0\n'
            'vllm:iteration_tokens_total_count{engine="0"} 7.0\n'
            'vllm:iteration_tokens_total_count{engine="1"} 2.0\n')
    assert parse_series(page) == {STEPS: 9.0}


def test_free_slot_refusals_per_class():
    samples = [refused("short", 1.0), refused("short", 6.0), refused("long", 7.0),
               Sample("long", 8, 0.0, status="succeeded", ok=True)]
    assert free_slot_counts(samples, SERIES, SLOTS, {"short": ["a"], "long": ["a"]}) == \
        {"short": 1, "long": 1}


@pytest.fixture
def engine_server():
    """A stand-in engine whose /metrics the test sets."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = self.server.page.encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.page = vllm_page({"0": 2}, {"length": 10}, prefix=(100, 10))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_the_watch_samples_running_and_counts_what_each_engine_served(engine_server):
    url = f"http://127.0.0.1:{engine_server.server_port}/metrics"
    watch = EngineWatch({"e0": url, "gone": "http://127.0.0.1:9/metrics"}, interval_s=0.01)
    watch.start()
    engine_server.page = vllm_page({"0": 3}, {"length": 13, "stop": 1}, prefix=(900, 410),
                                   waiting=1)
    deadline = time.monotonic() + 30
    while not any(p[1] == 4.0 for p in watch.series["e0"]) and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    got = watch.stop()
    # running and waiting: what the engine holds
    held = {p[1] for p in got["series"]["e0"]}
    assert 4.0 in held and held <= {2.0, 4.0} and got["series"]["gone"] == []
    assert got["served"] == {"e0": 4, "gone": None}
    assert got["prefix_cache"] == {"e0": {"queries": 800.0, "hits": 400.0}, "gone": None}
