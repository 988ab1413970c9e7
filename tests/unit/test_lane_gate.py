"""The lane gate's queue changes: what a Celery consumer is told to consume, in lane order.

The consumer here records the calls the gate makes on Celery's Consumer (its methods of the
same names); the real consumer is exercised end to end in tests/e2e/test_fleet_e2e.py."""

import threading
from types import SimpleNamespace

from tailguard.lanes.table import parse_lanes
from tailguard.worker.lane_gate import LaneGate, lane_of_task

TABLE = parse_lanes({
    "lanes": {
        "short": {"max_cost": 100, "max_tokens": 64, "max_num_seqs": 4},
        "long": {"max_tokens": 512, "max_num_seqs": 4, "max_running": 2},
        "batch": {"priority": "batch", "max_tokens": 512, "max_num_seqs": 4, "max_running": 1},
    },
    "workers": [{"name": "engine", "lanes": ["short", "long", "batch"]}],
})


class TaskConsumer:
    def __init__(self, consumer):
        self.consumer = consumer

    @property
    def queues(self):
        return [SimpleNamespace(name=q) for q in self.consumer.queues]


class Consumer:
    """Celery's Consumer as the gate uses it: its task consumer's queues, cancel/add,
    call_soon."""

    def __init__(self, queues):
        self.queues = list(queues)
        self.calls, self.soon = [], []
        self.task_consumer = TaskConsumer(self)

    def cancel_task_queue(self, name):
        self.calls.append(("cancel", name))
        self.queues.remove(name)

    def add_task_queue(self, name):
        self.calls.append(("add", name))
        self.queues.append(name)

    def call_soon(self, fn):
        self.soon.append(fn)


def _from_a_pool_thread(fn, *args):
    t = threading.Thread(target=fn, args=args)
    t.start()
    t.join()


def _gate():
    consumer = Consumer(["short", "long", "batch"])
    return LaneGate(list(TABLE), consumer), consumer


def test_task_names_carry_their_lane():
    assert lane_of_task("tailguard.generate.long") == "long"
    assert lane_of_task("celery.ping") is None


def test_a_lane_at_its_limit_stops_being_consumed_and_batch_with_it():
    gate, consumer = _gate()
    gate.received("a", "tailguard.generate.short")
    gate.received("b", "tailguard.generate.long")
    assert consumer.calls == []
    gate.received("c", "tailguard.generate.long")  # long's two slots taken
    assert consumer.queues == ["short"]
    assert not gate.over("c")


def test_short_jobs_reaching_longs_max_ahead_close_long_until_one_ends():
    table = parse_lanes({"lanes": {"short": {"max_cost": 100, "max_tokens": 64, "max_num_seqs": 4},
                                   "long": {"max_tokens": 512, "max_num_seqs": 4, "max_ahead": 2}},
                         "workers": [{"name": "engine", "lanes": ["short", "long"]}]})
    consumer = Consumer(["short", "long"])
    gate = LaneGate(list(table), consumer)
    gate.received("a", "tailguard.generate.short")
    assert consumer.queues == ["short", "long"]
    gate.received("b", "tailguard.generate.short")  # two short jobs here: long goes elsewhere
    assert consumer.queues == ["short"]
    gate.ended("a")
    assert consumer.queues == ["short", "long"]


def test_a_lanes_limit_counts_the_lanes_after_it():
    gate, consumer = _gate()
    gate.received("b", "tailguard.generate.batch")  # batch full: short, long still open
    assert consumer.queues == ["short", "long"]
    gate.received("c", "tailguard.generate.long")  # long + batch reach long's limit of two
    assert consumer.queues == ["short"]
    _from_a_pool_thread(gate.ended, "b")  # the change runs in the consumer's thread, later
    assert len(consumer.soon) == 1 and consumer.queues == ["short"]
    consumer.soon.pop()()
    assert consumer.queues == ["short", "long", "batch"]


def test_reopening_long_puts_it_before_batch():
    gate, consumer = _gate()
    gate.received("l", "tailguard.generate.long")
    gate.received("m", "tailguard.generate.long")
    assert consumer.queues == ["short"]
    consumer.queues.append("batch")  # as after a reconnect that consumed batch again
    _from_a_pool_thread(gate.ended, "l")
    consumer.soon.pop()()
    assert consumer.queues == ["short", "long", "batch"]  # batch went and came back after long


def test_a_message_past_the_limit_is_over_and_an_end_is_counted_once():
    gate, consumer = _gate()
    gate.received("x", "tailguard.generate.long")
    gate.received("w", "tailguard.generate.long")
    gate.received("y", "tailguard.generate.long")  # raced the cancel
    assert gate.over("y") and not gate.over("x") and not gate.over("w")
    assert gate.running()["long"] == 3
    gate.ended("y")
    gate.ended("y")
    assert gate.running()["long"] == 2
    gate.received("z", "celery.ping")  # not a lane's task: not counted
    assert sum(gate.running().values()) == 2


def test_a_workers_own_queues_go_just_ahead_of_their_lanes_and_count_as_them():
    """Prefix affinity: jobs offered to this worker first wait on its own queue of each lane."""
    own = {lane: f"{lane}.w.me@host" for lane in ("short", "long", "batch")}
    consumer = Consumer(["short", "long", "batch"])
    gate = LaneGate(list(TABLE), consumer, own)
    gate.apply()
    assert consumer.queues == ["short.w.me@host", "short", "long.w.me@host", "long",
                               "batch.w.me@host", "batch"]
    gate.received("a", "tailguard.generate.long")  # from long's own queue: long's task
    gate.received("b", "tailguard.generate.long")
    assert consumer.queues == ["short.w.me@host", "short"]  # long (and batch) at their limit
    gate.ended("a")
    assert consumer.queues == ["short.w.me@host", "short", "long.w.me@host", "long",
                               "batch.w.me@host", "batch"]


def test_prompt_tokens_not_yet_at_their_first_token_close_every_queue_until_one_is():
    consumer = Consumer(["short", "long", "batch"])
    gate = LaneGate(list(TABLE), consumer, max_prefill_tokens=2048)
    gate.received("a", "tailguard.generate.short", 1250)
    assert consumer.queues == ["short", "long", "batch"] and gate.prefilling() == {"short": 1250}
    gate.received("b", "tailguard.generate.short", 1250)  # two cold prompts: the bound
    assert consumer.queues == [] and not gate.over("b")
    gate.received("c", "tailguard.generate.short", 10)  # raced the cancel: given back
    assert gate.over("c") and gate.prefilling() == {"short": 2500}
    gate.ended("c")
    _from_a_pool_thread(gate.prefilled, "a")  # a's first token, in its task's thread
    consumer.soon.pop()()
    assert consumer.queues == ["short", "long", "batch"] and gate.prefilling() == {"short": 1250}
    gate.prefilled("a")  # once only
    assert not consumer.soon and gate.running()["short"] == 2
    gate.ended("b")  # ended before its first token: its prompt leaves the count too
    assert sum(gate.prefilling().values()) == 0 and gate.running()["short"] == 1


def test_a_long_prompt_prefilling_closes_long_and_batch_not_short():
    consumer = Consumer(["short", "long", "batch"])
    gate = LaneGate(list(TABLE), consumer, max_prefill_tokens=1024)
    gate.received("a", "tailguard.generate.long", 2000)
    assert consumer.queues == ["short"]
    gate.received("b", "tailguard.generate.short", 30)  # a short one still starts beside it
    assert not gate.over("b") and consumer.queues == ["short"]
    gate.received("c", "tailguard.generate.long", 2000)  # raced the close: given back
    assert gate.over("c")
    gate.ended("c")
    gate.prefilled("a")
    assert consumer.queues == ["short", "long", "batch"]


def test_without_a_prefill_bound_prompt_tokens_close_nothing():
    gate, consumer = _gate()
    gate.received("a", "tailguard.generate.short", 100_000)
    assert consumer.queues == ["short", "long", "batch"]
