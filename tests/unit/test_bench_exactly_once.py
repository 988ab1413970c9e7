"""The bench's exactly-once check: every accepted job ends once, by the client's reads and by
the finished stream's terminal entries."""

from test_bench_report import statuses

from tailguard.bench.exactly_once import check, describe
from tailguard.bench.loadgen import Sample
from tailguard.bench.report import build_report


def accepted(job_id, finished=True):
    return Sample("short", 8, 0.0, sent_s=0.0, status="succeeded" if finished else "timeout",
                  ok=finished, accepted=True, finished=finished, job_id=job_id,
                  ttft_s=0.1 if finished else None, e2e_s=1.0 if finished else None,
                  completion_tokens=8 if finished else None)


def test_every_job_ended_once_passes():
    samples = [accepted("a"), accepted("b"), Sample("short", 8, 0.0, status="refused")]
    c = check(samples, {"a": 1, "b": 1, "warmup": 1})
    assert c["ok"] and (c["accepted"], c["ended_once"], c["never_ended"]) == (2, 2, 0)


def test_a_job_never_ended_or_ended_twice_fails_and_is_named():
    c = check([accepted("a"), accepted("b"), accepted("c", finished=False)],
              {"a": 2, "c": 1, "warmup": 2})
    assert not c["ok"]
    assert (c["never_ended"], c["never_ended_ids"]) == (1, ["b"])
    assert (c["ended_twice"], c["ended_twice_ids"]) == (2, ["a", "warmup"])
    assert (c["not_terminal"], c["not_terminal_ids"]) == (1, ["c"])
    text = describe("lanes", c)
    assert "1 never ended (b)" in text and "2 ended twice (a, warmup)" in text


def test_a_job_id_answered_to_two_requests_fails():
    c = check([accepted("a"), accepted("a")], {"a": 1})
    assert not c["ok"] and c["answered_twice_ids"] == ["a"]


def test_without_the_stream_only_the_clients_view_is_checked():
    c = check([accepted("a")], None)
    assert c["ok"] and not c["stream_read"] and "ended_once" not in c


def test_the_report_has_a_line_per_checked_topology():
    samples = {"lanes": {"mixed": [accepted("a")]}, "direct": {"mixed": [accepted(None)]}}
    r = build_report(config={"metric": "e2e_s"},
                     workload={"name": "mixed", "classes": ["short"], "short_class": "short",
                               "long_class": None, "params": {}},
                     topologies={"lanes": {"exactly_once": check([accepted("a")], {})}},
                     samples=samples)
    s = statuses(r)
    assert s["exactly_once_lanes"] == "FAIL" and "exactly_once_direct" not in s
