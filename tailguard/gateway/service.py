"""The gateway's domain logic: accept a request, place it on its lane, report on it.

Framework-free: the Flask views in app/ are a thin skin over this (they ask the Gateway,
they do not compute), and tests can drive it directly. Dependencies (lane table, job store,
token counter, the broker: app/ passes a producer-only Celery app, and for OpenAI requests
vLLM's render layer: ``openai_frontend``; the finished-jobs consumer and the reaper, whose
threads `Gateway.start` and `Gateway.close` own) are passed in; nothing here imports Celery.
Native and OpenAI requests take one submit path (`Submission`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import redis

from tailguard.errors import (
    EngineError,
    InvalidField,
    JobCancelled,
    JobExpired,
    JobNotFound,
    JobStateConflict,
    LaneFull,
    NoLiveWorker,
    PromptTooLong,
    Refused,
    ResultTimeout,
    TailguardError,
    WaitTooLong,
    error_class,
)
from tailguard.gateway.api_keys import TOKENS, ApiKey, ApiKeyStore, check_cost
from tailguard.gateway.openai_request import Endpoint, OpenAIJob
from tailguard.gateway.wait_slots import WaitSlots
from tailguard.jobs.finished import FinishedConsumer, JobEnds
from tailguard.jobs.lane_load import LaneLoadStore
from tailguard.jobs.liveness import Liveness, lane_health
from tailguard.jobs.prefix_index import PrefixIndex
from tailguard.jobs.reaper import Reaper
from tailguard.jobs.store import (
    CANCELLED,
    EXPIRED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    TERMINAL,
    BacklogMoved,
    FairHold,
    JobStore,
    timing,
)
from tailguard.jobs.stream import (
    StreamEvent,
    follow,
    response_body,
    valid_stream_id,
    with_output,
)
from tailguard.lanes.admission import AdmissionPolicy, LaneLoad
from tailguard.lanes.affinity import Holdings, prefix_depths
from tailguard.lanes.latency_targets import (
    LatencyTarget,
    TargetBounds,
    admit_target,
    clamp_target,
    preferring_lanes_in_time,
    target_outcome,
)
from tailguard.lanes.placement import Placement, Prefer
from tailguard.lanes.table import Lane, LaneTable
from tailguard.observe.metrics import GatewayMetrics
from tailguard.observe.stats import StatsStore
from tailguard.redis import keys
from tailguard.redis.keys import is_job_id

#: A waiting call reads its job's record at least this often, its end announced or not: what
#: an announcement missed (the finished stream's follower was cut off) costs at most.
BACKSTOP_S = 10.0

log = logging.getLogger("tailguard.api")


class TokenCounter(Protocol):
    model_max_len: int | None

    def encode(self, prompt: str, add_special_tokens: bool = True) -> list[int]: ...


class Broker(Protocol):
    """What the gateway needs of Celery (tailguard.jobs.task_message.TaskMessages): a task's
    message for a lane's queue, which the job store pushes with the job's record; revoking
    a task."""

    control: Any  # celery.app.control.Control: .revoke(task_id)

    def build(self, name: str, *, task_id: str, queue: str, kwargs: dict[str, Any],
              expires_s: float) -> str: ...


class Submission(Protocol):
    """A request kind on the one submit path, as vLLM's serving classes share one request
    lifecycle: tailguard's native request (tailguard.gateway.job_request.JobRequest) and an
    OpenAI one rendered by vLLM (tailguard.gateway.openai_request.OpenAIJob). Each is a
    frozen dataclass (a key's ceiling lowers its ``priority`` with dataclasses.replace) and
    contributes only what differs: how it is placed, what its record and its task carry."""

    @property
    def priority(self) -> str: ...

    def within(self, bounds: TargetBounds) -> Submission:
        """It with what its key's bounds limit applied (vLLM's integer priority)."""
        ...

    def place(self, lanes: LaneTable, count_prompt: Callable[[str, bool], int],
              model_max_len: int | None, prefer: Prefer | None = None,
              cached_tokens: int = 0) -> Placement:
        """Its lane (with `prefer`, placement.place's preference among the lanes that accept
        it; `cached_tokens` of its prompt left out of its cost), max_tokens and cost;
        InvalidField (or PromptTooLong, from `count_prompt`) for what could never run there."""
        ...

    def record_fields(self, job_id: str) -> dict[str, Any]:
        """What the job record keeps of it besides its placement (``sampling``, ...)."""
        ...

    def token_ids(self, encode: Callable[[str, bool], list[int]]) -> Sequence[int]:
        """Its prompt's token ids (`encode`: the API's tokenizer, where it has no ids yet)."""
        ...

    def task_kwargs(self, job_id: str, placement: Placement) -> dict[str, Any]:
        """The lane task's keyword arguments of its own (``prompt``, ``sampling``, ...)."""
        ...


class OpenAIRenderer(Protocol):
    """What the gateway needs of vLLM's render layer (tailguard.gateway.openai_frontend)."""

    @property
    def status(self) -> str: ...  # "idle", "starting", "ready" or "failed"

    def prepare(self, endpoint: Endpoint, body: Any,
                check_prompt_bytes: Callable[[int], None]) -> OpenAIJob: ...

    def start(self) -> None: ...

    def close(self) -> None: ...


class PrefixAffinity:
    """Where a request is queued with prefix affinity on (TAILGUARD_PREFIX_AFFINITY): the
    worker that served its prefix lately, first (tailguard/jobs/prefix_index.py)."""

    def __init__(self, index: PrefixIndex, block_tokens: int) -> None:
        self.index = index
        self.block_tokens = block_tokens

    def look_up(self, token_ids: Sequence[int], lanes: Sequence[Lane]) -> Holdings:
        """What the index holds for a prompt of these tokens, with `lanes`' live workers."""
        named = prefix_depths(token_ids, self.block_tokens)
        return self.index.look_up([k for k, _ in named], [d for _, d in named], lanes)

    def offer(self, holdings: Holdings, worker: str | None, lane: Lane, job_id: str,
              fields: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
        """The queue for a job with these `holdings` offered to `worker` (None: to none) and
        the offer to record with it (None: its lane's queue). Its prefixes go into its record
        (`fields`), for its worker to remember once it has served them, and the worker it is
        offered to (``offered_to``)."""
        if holdings.prefixes:
            fields["prefixes"] = " ".join(holdings.prefixes)
        if worker is None:
            return lane.queue, None
        fields["offered_to"] = worker  # its worker ends the offer as it starts it
        return keys.worker_queue(lane.queue, worker), self.index.offer_args(job_id, worker, lane)


class Gateway:
    """The API's one long-lived object, built whole by the app (app/gateway_ext.py): every
    collaborator passed in, its background threads started by `start` and stopped by `close`."""

    def __init__(self, lanes: LaneTable, store: JobStore, counter: TokenCounter, broker: Broker,
                 *, metrics: GatewayMetrics | None = None, poll_interval_s: float = 0.25,
                 admission: AdmissionPolicy | None = None, load: LaneLoadStore | None = None,
                 stats: StatsStore | None = None, api_keys: ApiKeyStore | None = None,
                 max_prompt_bytes: int | None = None, max_waits_per_key: int = 0,
                 openai: OpenAIRenderer | None = None, model: str | None = None,
                 finished: FinishedConsumer | None = None, consume_finished: bool = True,
                 reaper: Reaper | None = None, auth_mode: str | None = None,
                 fair_share: bool = True, affinity: PrefixAffinity | None = None) -> None:
        self.lanes = lanes
        #: per lane, the lanes whose running jobs take its slots (admission counts them)
        self._sharing = {lane.name: lanes.sharing(lane.name) for lane in lanes}
        self.store = store
        self.counter = counter
        self.broker = broker
        #: the served model as configured (/v1/lanes reports it)
        self.model = model
        #: the authentication mode the app serves (open or keys): /healthz reports it, and
        #: `start` records it in Redis for `tailguard keys add`
        self.auth_mode = auth_mode
        #: dispatch and refuse in fair order by key (tailguard/lanes/fair_share.py) where
        #: callers have keys; arrival order otherwise
        self.fair_share = fair_share
        #: offer requests to the worker that served their prefix lately (None: off)
        self.affinity = affinity
        self.metrics = metrics or GatewayMetrics(lanes.names)
        self.admission = admission or AdmissionPolicy()
        self.load = load or LaneLoadStore(store.redis)
        self.stats = stats or StatsStore(store.redis)
        self.api_keys = api_keys or ApiKeyStore(store.redis)
        #: prompts longer than this (UTF-8 bytes) are refused before they are tokenized
        self.max_prompt_bytes = max_prompt_bytes
        self.wait_slots = WaitSlots(max_waits_per_key)
        #: vLLM's render layer for the OpenAI routes (None: this gateway serves none)
        self.openai = openai
        #: the consumer of finished jobs (its sinks: the request log, metrics, stats, the
        #: lanes' service rate); its thread runs only if `consume_finished` (off: tests drive
        #: it with run_once)
        self.finished = finished
        self._consume_finished = consume_finished
        #: ends dead workers' running jobs and redelivers lost messages (None: not here)
        self._reaper = reaper
        #: how often a waiting call asks whether its client is still there (a local check)
        self.poll_interval_s = poll_interval_s
        #: wakes waiting calls when their job ends (one thread, started by the first wait)
        self.ends = JobEnds(store.redis)
        self.metrics.watch_storage(store.storage)
        #: set by close(): stops the reaper's thread
        self._stopping = threading.Event()
        self._start_lock = threading.Lock()
        self._started = False

    def start(self) -> None:
        """Start the background work, once (later calls do nothing): recording the auth mode,
        moving lapsed prefix-affinity offers to their lanes' queues (when on),
        building vLLM's render layer for the OpenAI routes, the finished-jobs consumer, the
        reaper. Called when the serving process starts (after gunicorn's fork: a thread would
        not survive it)."""
        with self._start_lock:
            if self._started:
                return
            self._started = True
        if self.auth_mode is not None:
            try:
                self.api_keys.record_mode(self.auth_mode)
            except redis.RedisError as exc:  # the API serves all the same; `keys add` cannot tell
                log.warning("could not record the auth mode (%s) in Redis: %s", self.auth_mode, exc)
        if self.openai is not None:
            self.openai.start()
        if self._consume_finished and self.finished is not None:
            self.finished.start()
        if self._reaper is not None:
            self._reaper.start(self._stopping)
        if self.affinity is not None:
            # lapsed offers move to their lanes' queues
            self.affinity.index.start(self._stopping, self.lanes.lanes)

    def close(self) -> None:
        """Stop the background threads (finished-stream consumer, reaper, the job-end
        follower): what a process that builds more than one app, a test run, calls when it is
        done with one."""
        self._stopping.set()
        self.ends.stop()
        if self.openai is not None:
            self.openai.close()
        if self.finished is not None:
            self.finished.stop()

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Whether the system serves (Redis answers and has room for new jobs, every lane has
        a live worker), and the /healthz body that says so (with the auth mode: open or keys)."""
        healthy, body = lane_health(Liveness(self.store.redis), self.lanes.names)
        if self.auth_mode is not None:
            body["auth"] = self.auth_mode
        memory = self.store.storage.memory()
        body["storage"] = memory.to_dict()
        if memory.full:
            healthy, body["status"] = False, "degraded"
        return healthy, body

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Whether this API can take and answer requests: Redis answers (within its socket
        timeout). Lanes and workers are /healthz's: without them each request is answered."""
        try:
            self.store.redis.ping()
        except redis.RedisError as exc:
            return False, {"status": "unready", "redis": f"{type(exc).__name__}: {exc}"}
        return True, {"status": "ok", "redis": "ok"}

    def lanes_view(self) -> dict[str, Any]:
        """The lane table with the live workers serving each lane, per host, and the workers'
        entries (/v1/lanes)."""
        liveness = Liveness(self.store.redis)
        per_host = liveness.live_workers_per_host(self.lanes.names)
        return {"model": self.model, "model_max_len": self.counter.model_max_len,
                "lanes": [{**lane.to_dict(), "live_workers_per_host": per_host[lane.name]}
                          for lane in self.lanes],
                "workers": [{"name": w.name, "lanes": list(w.lanes)} for w in self.lanes.workers]}

    def openai_ready(self) -> bool:
        """Whether this gateway can serve OpenAI requests (vLLM's render layer is built; vLLM's
        /health), starting to build it if nothing asked for it yet."""
        if self.openai is None:
            return False
        if self.openai.status in ("idle", "starting"):
            self.openai.start()
        return self.openai.status == "ready"

    def prepare_openai(self, endpoint: Endpoint, body: Any,
                       header_request_id: str | None = None) -> OpenAIJob:
        """An OpenAI body validated and rendered by vLLM (its prompt past the byte bound is
        refused before it is rendered): a 400 for anything vLLM would refuse.
        `header_request_id`: its X-Request-Id, which names it as vLLM's server would."""
        if self.openai is None:
            raise InvalidField("this API serves no OpenAI routes", field="body")
        field = {"chat": "messages", "responses": "input"}.get(endpoint, "prompt")
        job = self.openai.prepare(endpoint, body,
                                  lambda size: self._check_prompt_bytes(size, field))
        return dataclasses.replace(job, header_request_id=header_request_id)

    def submit(self, req: Submission, caller: ApiKey | None = None,
               asked_target: tuple[int | None, int | None] = (None, None),
               job_id: str | None = None, token_bucket: str = TOKENS) -> dict[str, Any]:
        """Check what can be checked cheaply first (the prompt's size in bytes; the caller's
        call was charged to its key already, `charge_call`), then tokenize and place it,
        refuse what could never run (min_tokens above the granted max_tokens, or for an OpenAI
        request anything vLLM refuses at the granted max_tokens; a cost above the key's whole
        tokens/min), admit it on its lane, charge its cost to the key, then record the job and
        queue its task message in one Redis call. One path for both request kinds: what
        differs is the request's own (`Submission`).

        Returns the 202 body; raises Refused (429) or NoLiveWorker (503), counted per lane
        and per key, or StorageFull (503) before anything else while Redis is past its
        high-water mark. A key's priority ceiling lowers the request's class before placement;
        `asked_target` (the ttft and tpot ms its headers ask for: latency_targets) is clamped
        into the key's bounds, and a TTFT target the lane's predicted wait misses is a 429.

        `job_id`: the job's id chosen by the caller (a batch line's, deterministic), the job
        then created only if no job has it (JobStateConflict otherwise); by default a new one.
        `token_bucket`: which of the key's tokens buckets its cost is charged to
        (tailguard.gateway.api_keys: TOKENS, or a batch line's BATCH_TOKENS).
        """
        self.store.storage.check()  # StorageFull (503): Redis is past its high-water mark
        target = clamp_target(*asked_target, caller.bounds if caller else TargetBounds())
        if caller is not None:
            req = dataclasses.replace(req, priority=caller.priority_for(req.priority))
            req = req.within(caller.bounds)
        loads: dict[str, LaneLoad] = {}  # each lane's read once
        prefer = preferring_lanes_in_time(target, lambda p: self._predicted_wait_s(p, loads)
                                          + self.admission.first_token_s(p.prompt_tokens))
        fair = self._fair_hold(caller)
        placement, offered_to, holdings = self._place(req, prefer, fair)
        if caller is not None:
            check_cost(caller, placement.cost)
        lane = self.lanes[placement.lane]
        load = loads.get(lane.name) or self._lane_load(lane.name)
        wait_s = self._admit(lane, load, placement, caller, target, token_bucket, fair)
        only_new = job_id is not None
        job_id = job_id or uuid.uuid4().hex
        fields = {
            "lane": lane.name, "priority": req.priority, "prompt_tokens": placement.prompt_tokens,
            "requested_max_tokens": placement.requested_max_tokens,
            "max_tokens": placement.max_tokens, "max_tokens_capped": placement.max_tokens_capped,
            "cost": placement.cost, "deadline_s": lane.deadline_s,
            "api_key": caller.name if caller else None,
            "owner": caller.id if caller else None,  # the key whose job it is (ids are not names)
            "slo_ttft_ms": target.ttft_ms, "slo_tpot_ms": target.tpot_ms,
            **req.record_fields(job_id),
        }
        kwargs = {"job_id": job_id, "max_tokens": placement.max_tokens,
                  "deadline_s": lane.deadline_s, "prefill_tokens": placement.new_prompt_tokens,
                  **req.task_kwargs(job_id, placement)}
        message = self.broker.build(lane.task_name, task_id=job_id, queue=lane.queue,
                                    expires_s=lane.queue_ttl_s, kwargs=kwargs)
        queue, offer = lane.queue, None
        if self.affinity is not None and holdings is not None:
            queue, offer = self.affinity.offer(holdings, offered_to, lane, job_id, fields)
        self._record(job_id, fields, lane, load, placement, (queue, message), caller,
                     only_new, fair, offer)
        self.metrics.on_accepted(lane.name, placement.max_tokens_capped, self._key_label(caller))
        return {"id": job_id, "status": QUEUED, "lane": lane.name, "priority": req.priority,
                "prompt_tokens": placement.prompt_tokens,
                "requested_max_tokens": placement.requested_max_tokens,
                "max_tokens": placement.max_tokens,
                "max_tokens_capped": placement.max_tokens_capped, "cost": placement.cost,
                "estimated_start_s": round(wait_s, 3),
                **({"latency_target": target.to_dict()} if target.asked else {})}

    def _place(self, req: Submission, prefer: Prefer, fair: FairHold | None
               ) -> tuple[Placement, str | None, Holdings | None]:
        """`req`'s placement, the worker prefix affinity offers it to (None: none) and what the
        index holds for its prompt (None: affinity is off, or fair order dispatches it). Placed
        whole first (the prompt's byte bound before any tokenizing); the tokens a live worker
        holds then leave its cost when it is offered to that worker: a conversation's turn is
        classed by what its engine computes, its history excluded."""
        encode = functools.cache(self._encode_prompt)  # a native prompt tokenized once
        place = functools.partial(req.place, self.lanes, lambda p, s: len(encode(p, s)),
                                  self.counter.model_max_len, prefer)
        placement = place()
        if self.affinity is None or fair is not None:
            return placement, None, None
        policy = self.affinity.index.policy
        holdings = self.affinity.look_up(req.token_ids(encode),
                                         [l for l in self.lanes if l.priority == req.priority])
        cached = holdings.cached_tokens(self.affinity.block_tokens)
        if cached:
            cheaper = place(cached_tokens=cached)
            worker = holdings.offer_to(cheaper.lane, policy)
            if worker is not None:
                return cheaper, worker, holdings
        return placement, holdings.offer_to(placement.lane, policy), holdings

    def _lane_load(self, lane: str) -> LaneLoad:
        """What admission decides on for `lane`, the running jobs that share its slots included."""
        return self.load.load(lane, self._sharing[lane])

    def _predicted_wait_s(self, placement: Placement, loads: dict[str, LaneLoad]) -> float:
        """The wait admission predicts for a request placed so (its lane's load read into
        `loads` once); none for a lane admission would answer 503 (no worker to serve it)."""
        lane = self.lanes[placement.lane]
        if lane.name not in loads:
            loads[lane.name] = self._lane_load(lane.name)
        load = loads[lane.name]
        if not (load.live_workers or self.admission.admit_without_worker):
            return math.inf
        return (self.admission.wait_tokens(lane, load, placement.cost)
                / self.admission.service_rate(lane, load, placement.cost, placement.prompt_tokens))

    def _fair_hold(self, caller: ApiKey | None) -> FairHold | None:
        """The caller's place in fair order, where lanes dispatch in it (keys mode)."""
        if not self.fair_share or caller is None:
            return None
        return FairHold(caller.name, caller.weight)

    def _admission_decision(self, lane: Lane, load: LaneLoad, cost: int,
                            fair: FairHold | None, prompt_tokens: int = 0) -> float:
        """The predicted wait, or admission's refusal: the fair rule for a fair hold (the keys'
        held work read now), arrival order's otherwise."""
        try:
            return self.admission.admit(lane, load, cost, prompt_tokens)
        except (LaneFull, WaitTooLong):
            if fair is None:
                raise
        # only a lane past its limits needs the keys' held work (a Redis round trip)
        held = self.store.held_work(lane.name)
        return self.admission.admit_fairly(lane, load, cost, fair.key, held.tokens,
                                           {**held.weights, fair.key: fair.weight}, held.counters,
                                           held.running, prompt_tokens)

    def _admit(self, lane: Lane, load: LaneLoad, placement: Placement, caller: ApiKey | None,
               target: LatencyTarget, token_bucket: str = TOKENS,
               fair: FairHold | None = None) -> float:
        """Admit a request placed so on `lane` as `load` has it (in fair order with `fair`),
        and its TTFT target on the time to first token predicted, then charge its cost to the
        caller's key (its `token_bucket`): its predicted wait, or the refusal (counted)."""
        cost = placement.cost
        try:
            wait_s = self._admission_decision(lane, load, cost, fair, placement.prompt_tokens)
            admit_target(target, lane.name, wait_s,
                         self.admission.first_token_s(placement.prompt_tokens))
        except (Refused, NoLiveWorker) as exc:
            self._count_refusal(lane.name, exc, caller, load.now)
            raise
        if caller is not None:
            try:
                self.api_keys.take_tokens(caller, cost, token_bucket)
            except Refused as exc:
                self._count_key_refusal(lane.name, exc, caller)
                raise
        return wait_s

    def _record(self, job_id: str, fields: dict[str, Any], lane: Lane, load: LaneLoad,
                placement: Placement, message: tuple[str, str], caller: ApiKey | None,
                only_new: bool = False, fair: FairHold | None = None,
                offer: dict[str, Any] | None = None) -> None:
        """The record and the lane's message in one step: a worker never runs an unknown job,
        and no record waits for a message that was never sent (with `fair`, it waits held in
        its key's list until its turn: tailguard/redis/lua/fair_release.lua)."""
        try:
            self.store.create(job_id, fields, queue_ttl_s=lane.queue_ttl_s,
                              limits=self.admission.limits(lane, load, self._sharing[lane.name],
                                                           placement.cost, placement.prompt_tokens),
                              message=message,
                              only_new=only_new, fair=fair, offer=offer)
        except BacklogMoved as moved:
            # Other requests took the room this one was admitted into: decide again on the
            # lane as it is now (it raises, with the Retry-After that load gives).
            load = moved.moved(load)
            try:
                self._admission_decision(lane, load, placement.cost, fair, placement.prompt_tokens)
                raise WaitTooLong(f"lane {lane.name!r} filled up meanwhile", retry_after_s=1,
                                  lane=lane.name) from None
            except (Refused, NoLiveWorker) as exc:
                self._count_refusal(lane.name, exc, caller, load.now)
                raise

    def _count_refusal(self, lane: str, exc: Refused | NoLiveWorker, caller: ApiKey | None,
                       at: float | None) -> None:
        """A lane's refusal (`at`: the Redis clock of the load it was decided on), in /metrics
        and in `tailguard stats`."""
        self.metrics.on_refused(lane, exc.code, self._key_label(caller))
        self.stats.record_refused(lane, exc.code, at, key=None if caller is None else caller.name)

    def _count_key_refusal(self, lane: str | None, exc: Refused, caller: ApiKey) -> None:
        """A refusal of the caller's key's own limits (not the lane's), in /metrics and in
        `tailguard stats --by key`."""
        self.metrics.on_refused(lane, exc.code, self._key_label(caller))
        self.stats.record_refused(None, exc.code, key=caller.name)

    def _key_label(self, caller: ApiKey | None) -> str | None:
        return None if caller is None else self.metrics.key_label(caller.name, caller.id)

    def _encode_prompt(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        """A native prompt's token ids; one past the byte bound is refused before the tokenizer
        spends CPU on it."""
        if self.max_prompt_bytes is not None and len(prompt) * 4 > self.max_prompt_bytes:
            # at most 4 bytes a character: below that, no need to encode it
            self._check_prompt_bytes(len(prompt.encode("utf-8", "surrogatepass")))
        return self.counter.encode(prompt, add_special_tokens)

    def _check_prompt_bytes(self, size: int, field: str = "prompt") -> None:
        if self.max_prompt_bytes is not None and size > self.max_prompt_bytes:
            raise PromptTooLong(f"the prompt takes {size} bytes, more than the "
                                f"{self.max_prompt_bytes} this API tokenizes "
                                f"(TAILGUARD_MAX_PROMPT_BYTES)", field=field)

    def charge_call(self, caller: ApiKey) -> None:
        """Charge one call (any /v1/ route: reads and streams too) to the caller's requests per
        minute, before anything else is done for it; RateLimited (429) when over it."""
        try:
            self.api_keys.take_request(caller)
        except Refused as exc:
            self._count_key_refusal(None, exc, caller)
            raise

    def hold_wait(self, caller: ApiKey | None) -> Callable[[], None]:
        """A slot for one long-poll, stream or waiting OpenAI call of the caller's key (its
        release), or TooManyWaits (429). Calls without a key (open mode) are not counted."""
        if caller is None:
            return lambda: None
        try:
            return self.wait_slots.take(caller.id, caller.name)
        except Refused as exc:
            self._count_key_refusal(None, exc, caller)
            raise

    def check_owner(self, job_id: str, caller: ApiKey | None) -> None:
        """JobNotFound unless the caller may see the job: its own key's, any with an admin key
        or without keys (open mode). Another key's job is a 404 exactly like an unknown id, so
        a caller cannot even learn that it exists."""
        if not is_job_id(job_id):
            raise JobNotFound(f"no job {job_id!r}")
        if caller is None or caller.admin:
            return
        owner = self.store.redis.hget(keys.job_key(job_id), "owner")
        if owner is None or not caller.may_see(owner.decode() if isinstance(owner, bytes) else owner):
            raise JobNotFound(f"no job {job_id!r} (unknown, or its record expired)")

    def status(self, job_id: str, wait_s: float = 0.0, caller: ApiKey | None = None) -> dict[str, Any]:
        """The job as the client sees it (if it may: `check_owner`); with wait_s, long-poll
        until it is terminal."""
        self.check_owner(job_id, caller)
        return render(job_id, self.wait(job_id, wait_s))

    def wait(self, job_id: str, wait_s: float,
             still_wanted: Callable[[], bool] | None = None) -> dict[str, Any]:
        """The job record once terminal (its result's text read back from its stream), or as
        it is after wait_s.

        Waiting costs Redis nothing while the job is queued or runs: the wait blocks until
        the job's end is announced (JobEnds), and reads the record again only when it may
        have become overdue (settling it ends it then), every BACKSTOP_S in case an
        announcement was missed, and when wait_s is up. `still_wanted` (a local look at the
        client's socket) is asked every `poll_interval_s`; when it says no (the client hung
        up), the job is cancelled so it stops holding a place in its lane's engine.
        """
        if not is_job_id(job_id):
            raise JobNotFound(f"no job {job_id!r}")
        deadline = time.monotonic() + wait_s
        if wait_s <= 0:
            return self._settled(job_id)
        with self.ends.watch(job_id) as ended:
            while True:
                job = self._settled(job_id)
                now = time.monotonic()
                if job["status"] in TERMINAL or now >= deadline:
                    return job
                read_at = min(deadline, now + min(BACKSTOP_S, self._overdue_in(job)))
                while not ended.is_set() and (now := time.monotonic()) < read_at:
                    if still_wanted is not None and not still_wanted():
                        self.cancel(job_id, reason="the client disconnected", missing_ok=True)
                        return self.store.get(job_id) or job
                    ended.wait(min(self.poll_interval_s, read_at - now))

    def response_body(self, job_id: str) -> str | None:
        """A finished non-streamed OpenAI job's response: vLLM's JSON, as its worker wrote it."""
        return response_body(self.store.redis, job_id)

    def _settled(self, job_id: str) -> dict[str, Any]:
        """The record, overdue jobs settled (tailguard.jobs.store), a finished one's text read."""
        job = self.store.settle(job_id)
        if job is None:
            raise JobNotFound(f"no job {job_id!r} (unknown, or its record expired)")
        return with_output(self.store.redis, job_id, job)

    def _overdue_in(self, job: dict[str, Any]) -> float:
        """Seconds until settling could end `job` (its queue TTL, or its deadline + the worker-
        lost grace), by this host's clock against the record's Redis-clock stamps; at least
        `poll_interval_s`, so a clock a little ahead of Redis's costs a few reads, no spin."""
        if job["status"] == QUEUED and "expires_at" in job:
            at = job["expires_at"]
        elif job["status"] == RUNNING and "running_at" in job and "deadline_s" in job:
            at = job["running_at"] + job["deadline_s"] + self.store.worker_lost_grace_s
        else:
            return BACKSTOP_S
        return max(self.poll_interval_s, at - time.time())

    def cancel(self, job_id: str, *, reason: str = "cancelled by the client",
               missing_ok: bool = False, caller: ApiKey | None = None) -> dict[str, Any]:
        """Cancel a queued or running job. A running one is aborted in its engine at its
        worker's next read of the record (tailguard/worker/runner.py, STATUS_POLL_S)."""
        self.check_owner(job_id, caller)
        moved, before = self.store.transition(job_id, {QUEUED, RUNNING}, CANCELLED,
                                              {"error": JobCancelled(reason).to_dict()})
        if not moved and not missing_ok:
            if before is None:
                raise JobNotFound(f"no job {job_id!r} (unknown, or its record expired)")
            raise JobStateConflict(f"job {job_id} already ended ({before}): nothing to cancel")
        if moved and before == QUEUED:
            # Let a worker that already reserved the message drop it without running it
            # (the job record says cancelled either way); Flower shows it as revoked.
            self.broker.control.revoke(job_id)
        job = self.store.get(job_id)
        return render(job_id, job) if job else {"id": job_id, "status": CANCELLED}

    def events(self, job_id: str, after: str = "0-0", *, heartbeat_s: float = 2.0,
               just_submitted: bool = False,
               caller: ApiKey | None = None) -> Iterator[StreamEvent | None]:
        """The job's output events from `after` on, ending with its end event.

        Yields None on each `heartbeat_s` of silence (so the caller can write a
        heartbeat and notice a gone client); overdue jobs are settled meanwhile. May end
        with an "error" event instead (see `follow`): the job goes on. `just_submitted`:
        this process created the job a moment ago (a streamed submit), so it exists and
        is not overdue; the read that would check that is one less on its way to the
        first token. Another key's job is a JobNotFound (`check_owner`).
        """
        if not just_submitted:
            self.check_owner(job_id, caller)
        elif not is_job_id(job_id):
            raise JobNotFound(f"no job {job_id!r}")
        if not just_submitted and self.store.settle(job_id) is None:
            raise JobNotFound(f"no job {job_id!r} (unknown, or its record expired)")
        def status() -> str | None:
            job = self.store.settle(job_id)
            return None if job is None else job["status"]

        return follow(self.store.redis, job_id, after, heartbeat_s=heartbeat_s, status=status)


def render(job_id: str, job: dict[str, Any]) -> dict[str, Any]:
    """The public view of a job record."""
    return {
        "id": job_id,
        "status": job["status"],
        "lane": job.get("lane"),
        "priority": job.get("priority"),
        "prompt_tokens": job.get("prompt_tokens"),
        "requested_max_tokens": job.get("requested_max_tokens"),
        "max_tokens": job.get("max_tokens"),
        "max_tokens_capped": job.get("max_tokens_capped", False),
        "request_id": job.get("request_id"),
        "result": job.get("result"),
        "error": job.get("error"),
        "worker": job.get("worker"),
        "timing": timing(job),
        **({"latency_target": target_outcome(job)} if job.get("slo_ttft_ms") is not None
           or job.get("slo_tpot_ms") is not None else {}),
    }


def succeeded(job: Mapping[str, Any]) -> bool:
    """Whether a job (its record, or its end event's data) ended with its result."""
    return job["status"] == SUCCEEDED


#: how a job that ended in this state failed, when its record names no known code
_STATE_ERRORS: dict[str, type[TailguardError]] = {EXPIRED: JobExpired, CANCELLED: JobCancelled}


def job_error(job: Mapping[str, Any]) -> TailguardError:
    """The error a caller waiting for a job that did not succeed gets (status and code with it).

    A terminal job maps through the code in its record (else through its state);
    a job still queued or running when the caller stopped waiting is a ResultTimeout.
    """
    status = job["status"]
    if status not in TERMINAL:
        return ResultTimeout(f"no result within the lane's time budget (the job is {status})")
    error = job.get("error") or {}
    cls = error_class(error.get("code")) or _STATE_ERRORS.get(status, EngineError)
    return cls(error.get("message") or f"the request ended {status}")


def check_event_id(after: str) -> None:
    """InvalidField unless `after` (a stream's Last-Event-ID, or ?after=) is a stream id."""
    if not valid_stream_id(after):
        raise InvalidField(f"Last-Event-ID must be a stream id like 1700000000000-0, got {after!r}",
                           field="Last-Event-ID")
