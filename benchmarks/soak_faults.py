"""A soak that breaks things on purpose: the whole system under `tailguard up`, loaded from four
keys for a set time while a fault drawn at random is injected every 45-90 s; then it checks
that nothing was lost, run twice or left behind.

    .venv/bin/python benchmarks/soak_faults.py --duration 1800          (from the repository root)
    .venv/bin/python benchmarks/soak_faults.py --short                  (what CI runs: ~3 minutes)

The system: `tailguard up` (embedded Redis with its AOF, the API under gunicorn in keys mode,
two identical workers each hosting one engine that serves short, long and batch in order:
benchmarks/soak.lanes.toml, Flower), on the tiny test model, with its own TAILGUARD_HOME and
ports; `up` restarts what dies, as a process supervisor in production would.

The load, the whole time: keys `soak-a` and `soak-b` send the interactive mix (short and long
requests as native jobs, non-streamed and streamed OpenAI completions, and native jobs they
cancel after a moment), key `soak-flood` floods the short lane, key `soak-batch` runs a Batch API
batch (2,000 lines by default) started at the beginning.

The faults (one at a time, `--fault-every` s apart, drawn at random from a deck of the six,
so each comes up once in every six):
  worker_kill      kill -9 of one worker's process group (its engine included)
  redis_restart    kill -9 of redis-server: `up` restarts it from its append-only file
  api_restart      kill -9 of the API's process group: `up` starts it again
  worker_freeze    SIGSTOP of one worker's process group for 30 s, then SIGCONT
  input_delete     DELETE of the running batch's input file (must be refused: 409)
  lease_kill       kill -9 of the process holding the redelivery or the batch-feeder lease

Checked at the end (after a drain), and printed with the faults and the requests by outcome:
  - every job the clients were given an id for is terminal and readable, and every job record
    in Redis is terminal (stuck: 0); each is on the finished stream once (lost, twice: 0);
  - the batch ended `completed` with exactly one output or error line per input line;
  - the lanes' counters are at zero at rest (queued, backlog, running, held, fair-share
    tokens, running jobs, the Celery queues, kombu's unacked messages);
  - Redis memory back within 10% of its baseline once the (scaled-down) record TTLs passed;
  - no 5xx answer but 503, and no 503 outside a Redis outage (+10 s) but `no_live_worker`, or
    `message_lost` after a worker's kill or freeze (its BRPOP had taken the message before kombu
    recorded the delivery: docs/reliability.md; within the redelivery delay + 20 s);
    no client left without an answer past its lane's queue TTL + deadline, and no job ending
    later than that + 10 s (past_promise).

Writes soak.json under --out and exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tailguard import settings  # noqa: E402
from tailguard.engine.warmup import cpu_description  # noqa: E402
from tailguard.host.redis_server import free_port  # noqa: E402
from tailguard.jobs.store import TERMINAL  # noqa: E402
from tailguard.lanes.table import load_lanes  # noqa: E402
from tailguard.redis import keys  # noqa: E402

LANES = ROOT / "benchmarks" / "soak.lanes.toml"
FAULTS = ("worker_kill", "redis_restart", "api_restart", "worker_freeze", "input_delete",
          "lease_kill")
FREEZE_S = 30.0
#: a client's wait for one answer (a long-poll's included): above every bounded server wait
HTTP_TIMEOUT_S = 30
#: an OpenAI call's wait for its answer: above the longest lane's queue TTL + deadline
OPENAI_TIMEOUT_S = (10, 240)


# -- the system under `tailguard up` -------------------------------------------------------

@dataclass
class Up:
    home: Path
    api_port: int
    redis_port: int
    env: dict[str, str]
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def start(self, log: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tailguard.cli", "up"], cwd=ROOT,
                                     env=self.env, stdout=open(log, "w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def redis(self) -> redis.Redis:
        """A client of `up`'s embedded Redis (its password where `up` wrote it)."""
        password = (self.home / settings.REDIS_PASSWORD_FILE).read_text().strip()
        return redis.Redis(port=self.redis_port, password=password, socket_timeout=10)

    def children(self) -> list[psutil.Process]:
        """`up`'s children: each the leader of its own process group."""
        try:
            return psutil.Process(self.proc.pid).children()
        except psutil.NoSuchProcess:
            return []

    def child(self, role: str) -> list[psutil.Process]:
        found = []
        for p in self.children():
            try:
                line = " ".join(p.cmdline())
            except psutil.Error:
                continue
            if ((role == "redis" and "redis-server" in line)
                    or (role == "api" and "gunicorn" in line)
                    or (role == "worker" and " worker " in f"{line} " and "gunicorn" not in line)):
                found.append(p)
        return found

    def wait_ready(self, workers: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tailguard up exited with {self.proc.returncode}")
            try:
                health = requests.get(self.url + "/healthz", timeout=5)
                ready = (health.status_code == 200
                         and health.json().get("workers_per_lane", {}).get("short", 0) >= workers
                         and requests.get(self.url + "/health", timeout=5).status_code == 200)
            except (requests.RequestException, ValueError):
                ready = False
            if ready:
                return
            time.sleep(1)
        raise RuntimeError(f"the system was not ready within {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for p in self.child("worker"):  # their warm stop is no soak's business
            _signal_group(p.pid, signal.SIGKILL)
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(os.getpgid(pid), sig)
    except ProcessLookupError:
        pass


# -- what the clients saw -------------------------------------------------------------------

@dataclass
class Seen:
    """Every answer, by route and outcome; the job ids given out and whose they are."""

    outcomes: Counter = field(default_factory=Counter)
    jobs: dict[str, str] = field(default_factory=dict)  # job id -> key name
    server_errors: list[dict] = field(default_factory=list)  # 5xx, with when and what
    unanswered: list[dict] = field(default_factory=list)  # client timeouts
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, route: str, outcome: object) -> None:
        with self.lock:
            self.outcomes[f"{route} {outcome}"] += 1

    def accepted(self, job_id: str | None, key: str) -> None:
        if job_id:
            with self.lock:
                self.jobs[job_id] = key

    def answer(self, route: str, resp: requests.Response) -> None:
        code = ""
        if resp.status_code >= 400:
            try:
                code = resp.json()["error"]["code"]
            except (ValueError, KeyError, TypeError):
                code = "?"
        self.count(route, f"{resp.status_code}{' ' + code if code else ''}")
        if resp.status_code >= 500:
            with self.lock:
                self.server_errors.append({"t": time.time(), "route": route,
                                           "status": resp.status_code, "code": code})

    def failed(self, route: str, exc: Exception, waited_s: float) -> None:
        self.count(route, type(exc).__name__)
        if isinstance(exc, requests.Timeout):
            with self.lock:
                self.unanswered.append({"t": time.time(), "route": route, "waited_s": waited_s})


class Load:
    """One key's requests at Poisson arrivals, each on the pool, until stopped."""

    def __init__(self, up: Up, seen: Seen, key: str, secret: str, rate: float, *,
                 long_share: float, model: str, kinds: tuple[str, ...], seed: int) -> None:
        self.up, self.seen, self.key, self.rate = up, seen, key, rate
        self.auth = {"Authorization": f"Bearer {secret}"}
        self.long_share, self.model, self.kinds = long_share, model, kinds
        self.rng = random.Random(seed)

    def run(self, pool: ThreadPoolExecutor, stop: threading.Event) -> None:
        i = 0
        while not stop.wait(self.rng.expovariate(self.rate)):
            i += 1
            kind = self.rng.choice(self.kinds)
            # a cancelled job is a long one, so the DELETE finds it queued or running
            long = kind == "cancel" or self.rng.random() < self.long_share
            max_tokens = self.rng.randint(300, 600) if long else self.rng.randint(8, 64)
            pool.submit(self._one, kind, f"{self.key} {i}", max_tokens, self.rng.uniform(0, 1))

    def _one(self, kind: str, prompt: str, max_tokens: int, cancel_after_s: float) -> None:
        t0 = time.monotonic()
        route = kind
        try:
            if kind in ("job", "cancel"):
                resp = requests.post(self.up.url + "/v1/jobs", headers=self.auth,
                                     json={"prompt": prompt, "max_tokens": max_tokens,
                                           "ignore_eos": True}, timeout=HTTP_TIMEOUT_S)
                self.seen.answer(route, resp)
                if resp.status_code == 202:
                    job_id = resp.json()["id"]
                    self.seen.accepted(job_id, self.key)
                    if kind == "cancel":
                        time.sleep(cancel_after_s)
                        route = "cancel DELETE"
                        self.seen.answer(route, requests.delete(
                            f"{self.up.url}/v1/jobs/{job_id}", headers=self.auth,
                            timeout=HTTP_TIMEOUT_S))
            else:
                self._openai(kind == "stream", prompt, max_tokens)
        except requests.RequestException as exc:
            self.seen.failed(route, exc, time.monotonic() - t0)

    def _openai(self, stream: bool, prompt: str, max_tokens: int) -> None:
        route = "stream" if stream else "completion"
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                "ignore_eos": True, "stream": stream}
        with requests.post(self.up.url + "/v1/completions", headers=self.auth, json=body,
                           stream=stream, timeout=OPENAI_TIMEOUT_S) as resp:
            self.seen.accepted(resp.headers.get("X-Tailguard-Job-Id"), self.key)
            if not stream or resp.status_code != 200:
                self.seen.answer(route, resp)
                return
            ended = "cut"
            for line in resp.iter_lines(decode_unicode=True):
                if line == "data: [DONE]":
                    ended = "[DONE]"
                elif line.startswith("data: ") and '"error"' in line:
                    ended = "error " + json.loads(line[6:])["error"].get("code", "?")
            self.seen.count(route, f"200 {ended}")


class Watcher:
    """Reads each job the clients were given an id for through the API until it is terminal,
    as a client polling it would, while its record lives (the soak's record TTLs are short)."""

    def __init__(self, up: Up, seen: Seen, secrets: dict[str, str],
                 promise_s: dict[str, float]) -> None:
        self.up, self.seen, self.secrets = up, seen, secrets
        self.promise_s = promise_s  # lane -> its queue TTL + deadline
        self.states: dict[str, str] = {}
        self.late: list[dict] = []  # ended later than its lane promises an answer by
        self._client = up.redis()

    def _check_time(self, job_id: str, job: dict) -> None:
        """Its end against its lane's queue TTL + deadline (+ the worker-lost grace and a
        heartbeat: how late a dead worker's job may be settled), from its record's times."""
        record = {k.decode(): v.decode() for k, v in
                  self._client.hgetall(keys.job_key(job_id)).items()}
        ended = record.get(f"{job['status']}_at")
        if ended is None or "submitted_at" not in record:
            return
        took = float(ended) - float(record["submitted_at"])
        if took > self.promise_s.get(job.get("lane") or "", 0) + 10:
            self.late.append({"id": job_id, "lane": job.get("lane"), "status": job["status"],
                              "took_s": round(took, 1)})

    def run(self, stop: threading.Event, every_s: float = 2.0) -> None:
        while not stop.wait(every_s):
            self.poll()

    def poll(self) -> None:
        with self.seen.lock:
            jobs = list(self.seen.jobs.items())
        for job_id, key in jobs:
            if self.states.get(job_id) in TERMINAL:
                continue
            try:
                resp = requests.get(f"{self.up.url}/v1/jobs/{job_id}", timeout=HTTP_TIMEOUT_S,
                                    headers={"Authorization": f"Bearer {self.secrets[key]}"})
            except requests.RequestException:
                return  # the API restarts: the next round reads on
            if resp.status_code == 200:
                job = resp.json()
                self.states[job_id] = job["status"]
                if job["status"] in TERMINAL:
                    try:
                        self._check_time(job_id, job)
                    except redis.RedisError:
                        pass  # Redis restarts: its end was read, its times are not
            elif resp.status_code == 404:
                self.states[job_id] = "unreadable (404)"  # gone before it was read terminal
            elif resp.status_code != 503:
                self.states[job_id] = f"HTTP {resp.status_code}"

    def open(self) -> list[str]:
        return [j for j in self.seen.jobs if self.states.get(j) not in TERMINAL]


class FinishedFollower:
    """Counts each job's entries on the finished stream as they come (the API trims the
    stream's entries older than the record TTL, so a count read at the end would miss them)."""

    def __init__(self, up: Up) -> None:
        self.client = up.redis()  # it reconnects by itself after a restart
        self.counts: Counter = Counter()
        self.entries: dict[str, list[str]] = {}  # job id -> its entries' ids (their ms times)
        self._after = "0-0"

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.read(block_ms=1000)
            except redis.RedisError:
                stop.wait(1)  # Redis restarts: its AOF kept the entries, read on after

    def read(self, block_ms: int | None = None) -> None:
        reply = self.client.xread({keys.FINISHED_STREAM: self._after}, count=1000,
                                      block=block_ms)
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                job_id = keys.job_id_of(fields[b"key"].decode())
                self.counts[job_id] += 1
                self.entries.setdefault(job_id, []).append(entry_id.decode())
                self._after = entry_id


# -- the batch ------------------------------------------------------------------------------

class Batch:
    def __init__(self, up: Up, secret: str, model: str, lines: int) -> None:
        self.up, self.model, self.lines = up, model, lines
        self.auth = {"Authorization": f"Bearer {secret}"}
        self.file_id = self.batch_id = None

    def start(self) -> None:
        body = "".join(json.dumps({"custom_id": f"line-{i}", "method": "POST",
                                   "url": "/v1/completions",
                                   "body": {"model": self.model, "prompt": f"batch line {i}",
                                            "max_tokens": 8}}) + "\n"
                       for i in range(self.lines))
        resp = requests.post(self.up.url + "/v1/files", headers=self.auth,
                             files={"file": ("soak.jsonl", io.BytesIO(body.encode()))},
                             data={"purpose": "batch"}, timeout=HTTP_TIMEOUT_S)
        resp.raise_for_status()
        self.file_id = resp.json()["id"]
        resp = requests.post(self.up.url + "/v1/batches", headers=self.auth,
                             json={"input_file_id": self.file_id, "endpoint": "/v1/completions",
                                   "completion_window": "24h"}, timeout=HTTP_TIMEOUT_S)
        resp.raise_for_status()
        self.batch_id = resp.json()["id"]

    def status(self) -> dict:
        return requests.get(f"{self.up.url}/v1/batches/{self.batch_id}", headers=self.auth,
                            timeout=HTTP_TIMEOUT_S).json()

    def delete_input(self) -> int:
        return requests.delete(f"{self.up.url}/v1/files/{self.file_id}", headers=self.auth,
                               timeout=HTTP_TIMEOUT_S).status_code

    def results(self, record: dict) -> dict[str, Any]:
        """Each custom_id's lines across the output and error files."""
        ids: Counter = Counter()
        for part in ("output_file_id", "error_file_id"):
            if record.get(part):
                text = requests.get(f"{self.up.url}/v1/files/{record[part]}/content",
                                    headers=self.auth, timeout=HTTP_TIMEOUT_S).text
                ids.update(json.loads(line)["custom_id"] for line in text.splitlines() if line)
        return {"status": record["status"], "lines": self.lines,
                "request_counts": record.get("request_counts"),
                "custom_ids": len(ids), "twice": sum(1 for n in ids.values() if n > 1),
                "missing": self.lines - len(ids)}


# -- the faults -----------------------------------------------------------------------------

@dataclass
class Fault:
    kind: str
    at_s: float
    target: str = ""
    answer: str = ""
    ended_at: float = 0.0  # wall clock, for the windows in which a 503 is expected


class Injector:
    def __init__(self, up: Up, batch: Batch, rng: random.Random, every_s: tuple[float, float],
                 t0: float) -> None:
        self.up, self.batch, self.rng, self.every_s, self.t0 = up, batch, rng, every_s, t0
        self.faults: list[Fault] = []
        self.redis_down: list[tuple[float, float]] = []  # wall-clock windows
        #: wall-clock windows of a worker's kill or freeze (from its start to its end)
        self.workers_down: list[tuple[float, float]] = []

    def run(self, stop: threading.Event) -> None:
        deck: list[str] = []
        while not stop.wait(self.rng.uniform(*self.every_s)):
            if not deck:  # drawn at random without replacement: every kind comes up each round
                deck = self.rng.sample(FAULTS, len(FAULTS))
            kind = deck.pop()
            fault = Fault(kind, round(time.monotonic() - self.t0, 1))
            started = time.time()
            try:
                getattr(self, kind)(fault, stop)
            except (OSError, RuntimeError, IndexError, ValueError, psutil.Error, redis.RedisError,
                    requests.RequestException) as exc:  # said, not hidden
                fault.answer = f"not injected: {type(exc).__name__}: {exc}"
            fault.ended_at = time.time()
            self.faults.append(fault)
            print(f"[soak] t={fault.at_s:7.1f}s {kind:14} {fault.target} {fault.answer}",
                  flush=True)
            if kind == "redis_restart":
                self.redis_down.append((started, self._back(self._redis_answers)))
            elif kind in ("worker_kill", "worker_freeze"):
                self.workers_down.append((started, fault.ended_at))

    def _back(self, ready, timeout_s: float = 120) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not ready():
            time.sleep(0.2)
        return time.time()

    def _redis_answers(self) -> bool:
        try:
            client = self.up.redis()
            return bool(client.ping())
        except redis.RedisError:
            return False

    def _worker(self) -> psutil.Process:
        workers = self.up.child("worker")
        if not workers:
            raise RuntimeError("no worker process running")
        return self.rng.choice(workers)

    def worker_kill(self, fault: Fault, stop: threading.Event) -> None:
        victim = self._worker()
        fault.target = f"pid {victim.pid}"
        _signal_group(victim.pid, signal.SIGKILL)

    def worker_freeze(self, fault: Fault, stop: threading.Event) -> None:
        victim = self._worker()
        fault.target = f"pid {victim.pid}"
        _signal_group(victim.pid, signal.SIGSTOP)
        try:
            time.sleep(FREEZE_S)
        finally:
            _signal_group(victim.pid, signal.SIGCONT)

    def redis_restart(self, fault: Fault, stop: threading.Event) -> None:
        victim = self.up.child("redis")[0]
        fault.target = f"pid {victim.pid}"
        victim.kill()

    def api_restart(self, fault: Fault, stop: threading.Event) -> None:
        victim = self.up.child("api")[0]
        fault.target = f"pid {victim.pid}"
        _signal_group(victim.pid, signal.SIGKILL)

    def input_delete(self, fault: Fault, stop: threading.Event) -> None:
        fault.target = self.batch.file_id
        status = self.batch.status().get("status")
        fault.answer = f"{self.batch.delete_input()} (batch {status})"

    def lease_kill(self, fault: Fault, stop: threading.Event) -> None:
        which = self.rng.choice((keys.REDELIVER_LEASE, keys.BATCH_FEEDER_LEASE))
        owner = (self.up.redis().get(which) or b"").decode()
        # owners are "<host>-<pid>-<id>" (redelivery) or "<host>:<pid>:<id>" (the feeder)
        pid = int(owner.replace(":", "-").split("-")[-2]) if owner else 0
        if not pid:
            raise RuntimeError(f"nobody holds {which}")
        fault.target = f"{which.rsplit(':', 2)[-2]} holder pid {pid}"
        if pid in {p.pid for p in self.up.child("worker")}:
            _signal_group(pid, signal.SIGKILL)  # a worker: with its engine, as worker_kill
        else:
            os.kill(pid, signal.SIGKILL)  # an API process alone: gunicorn starts another


# -- the checks -----------------------------------------------------------------------------

def job_records(client: redis.Redis) -> dict[str, dict]:
    out = {}
    for key in client.scan_iter(f"{keys.PREFIX}:job:*", count=1000):
        name = key.decode()
        if not name.endswith(":stream"):
            out[keys.job_id_of(name)] = {k.decode(): v.decode() for k, v in
                                         client.hgetall(key).items()
                                         if k in (b"status", b"lane", b"submitted_at")}
    return out


def drain(up: Up, watcher: Watcher, batch: Batch, timeout_s: float) -> dict:
    """Until every job known is terminal (as read through the API), every job record in Redis
    too, and the batch ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        watcher.poll()
        records = job_records(up.redis())
        open_records = {j: r for j, r in records.items() if r.get("status") not in TERMINAL}
        record = batch.status()
        settled = (not watcher.open() and not open_records
                   and record.get("status") in ("completed", "failed", "cancelled", "expired"))
        if settled or time.monotonic() > deadline:
            return {"states": dict(watcher.states), "open_records": open_records,
                    "batch": record}
        time.sleep(2)


def settled_counters(client: redis.Redis, lanes: list[str], within_s: float) -> dict[str, int]:
    """The lanes' counters once all are zero, or as they stand after `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        counters = lane_counters(client, lanes)
        if not any(counters.values()) or time.monotonic() > deadline:
            return counters
        time.sleep(1)


def unacked_deliveries(client: redis.Redis) -> list[dict[str, Any]]:
    """What kombu still holds as delivered and not acked: each message's job and its state."""
    out = []
    for tag, raw in client.hgetall("unacked").items():
        try:
            job_id = json.loads(raw)[0]["headers"]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            job_id = None
        status = client.hget(keys.job_key(job_id), "status") if job_id else None
        out.append({"tag": tag.decode(), "job": job_id, "status": status.decode() if status else None,
                    "delivered_at": client.zscore("unacked_index", tag)})
    return out


def lane_counters(client: redis.Redis, lanes: list[str]) -> dict[str, int]:
    """Everything that counts work in flight; all zero at rest."""
    out: dict[str, int] = {"running_jobs": client.hlen(keys.RUNNING_JOBS),
                           "unacked": client.hlen("unacked")}
    for lane in lanes:
        out[f"{lane}.queued"] = client.zcard(keys.lane_queued_key(lane))
        out[f"{lane}.backlog"] = int(client.get(keys.lane_backlog_key(lane)) or 0)
        out[f"{lane}.running"] = client.zcard(keys.lane_running_key(lane))
        out[f"{lane}.held_tokens"] = sum(int(float(v)) for v in
                                         client.hvals(keys.lane_held_tokens_key(lane)))
        out[f"{lane}.running_tokens"] = sum(int(float(v)) for v in
                                            client.hvals(keys.lane_running_tokens_key(lane)))
        out[f"{lane}.held_jobs"] = sum(client.llen(k) for k in
                                       client.scan_iter(keys.lane_held_key(lane, "*")))
        out[f"{lane}.celery_queue"] = sum(client.llen(k) for k in client.scan_iter(f"{lane}*")
                                          if client.type(k) == b"list")
    return out


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def memory_by_kind(client: redis.Redis) -> dict[str, list[int]]:
    """Keys and their MEMORY USAGE bytes, by kind (the name up to its id): what the memory
    left above the baseline is."""
    kinds: dict[str, list[int]] = {}
    for key in client.scan_iter(count=1000):
        name = key.decode(errors="replace")
        parts = name.split(":")
        kind = ":".join(p if not any(c.isdigit() for c in p) or len(p) < 8 else "*"
                        for p in parts[:4])
        entry = kinds.setdefault(kind, [0, 0])
        entry[0] += 1
        entry[1] += client.memory_usage(key, samples=0) or 0
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1][1]))


def memory_back(client: redis.Redis, baseline: int, within_s: float) -> dict:
    deadline = time.monotonic() + within_s
    while True:
        now = used_memory(client)
        if now <= baseline * 1.10 or time.monotonic() > deadline:
            return {"baseline": baseline, "end": now, "ratio": round(now / baseline, 3),
                    "keys_by_kind": memory_by_kind(client)}
        time.sleep(5)


def expected_503(t: float, seen_windows: list[tuple[float, float]], grace_s: float = 10) -> bool:
    return any(a - 1 <= t <= b + grace_s for a, b in seen_windows)


# -- the run --------------------------------------------------------------------------------

def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=1800, help="seconds of load and faults")
    ap.add_argument("--fault-every", default="45,90", help="seconds between faults: MIN,MAX")
    ap.add_argument("--batch-lines", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=0.5, help="req/s of each of soak-a and soak-b")
    ap.add_argument("--flood-rate", type=float, default=2.0, help="req/s of soak-flood")
    ap.add_argument("--long-share", type=float, default=0.1)
    ap.add_argument("--ttl-scale", type=float, default=60,
                    help="the record and output TTLs are the defaults divided by this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--short", action="store_true",
                    help="CI's form: 125 s, faults 12-16 s apart (each kind once), 200 batch lines")
    ap.add_argument("--model", default=str(ROOT / ".tailguard" / "test-models" / "tiny"))
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if args.short:
        args.duration, args.fault_every, args.batch_lines, args.ttl_scale = 125, "12,16", 200, 240
    return args


def system_env(args: argparse.Namespace, home: Path, ports: dict[str, int], model: str) -> dict:
    record_ttl_s = max(20, round(settings.RECORD_TTL_S.default / args.ttl_scale))
    ttl = {settings.RECORD_TTL_S.env: record_ttl_s,
           settings.OUTPUT_TTL_S.env: max(20, round(settings.OUTPUT_TTL_S.default / args.ttl_scale)),
           # the per-minute stats as long as the records (a day's are no soak's business)
           settings.STATS_RETENTION_S.env: max(60, record_ttl_s),
           settings.BATCH_OUTPUT_TTL_S.env: 3600}
    # the embedded Redis, whatever the caller's environment names (the test suite's own)
    inherited = {k: v for k, v in os.environ.items()
                 if k not in (settings.REDIS_URL.env, settings.REDIS_ENABLE_COMMANDS.env)}
    return {**inherited, settings.HOME.env: str(home), settings.MODEL.env: model,
            settings.LANES_FILE.env: str(LANES), settings.API_AUTH.env: settings.AUTH_KEYS,
            settings.API_PORT.env: str(ports["api"]), settings.FLOWER_PORT.env: str(ports["flower"]),
            settings.REDIS_PORT.env: str(ports["redis"]), settings.WORKER_METRICS_PORT.env: "0",
            settings.WORKER_HEARTBEAT_S.env: "1", settings.WORKER_LOST_GRACE_S.env: "5",
            settings.CRASH_LOOP_RESTARTS.env: "1000", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", **{k: str(v) for k, v in ttl.items()}}


def add_keys(env: dict) -> dict[str, str]:
    secrets = {}
    for name in ("soak-a", "soak-b", "soak-flood", "soak-batch"):
        secrets[name] = subprocess.run([sys.executable, "-m", "tailguard.cli", "keys", "add", name],
                                       env=env, cwd=ROOT, check=True, capture_output=True,
                                       text=True).stdout.strip()
    return secrets


def run(args: argparse.Namespace) -> dict:
    from tailguard.model.demo import build_demo_model

    model = args.model if Path(args.model, "config.json").exists() else \
        str(build_demo_model(Path(args.model), size="tiny"))
    out = Path(args.out or tempfile.mkdtemp(prefix="tailguard-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    ports = {"api": free_port(), "flower": free_port(), "redis": free_port()}
    env = system_env(args, out / "home", ports, model)
    up = Up(out / "home", ports["api"], ports["redis"], env)
    lanes = [lane.name for lane in load_lanes(LANES).lanes]
    report: dict[str, Any] = {"args": vars(args),
                              "cpu": f"{cpu_description()}, {os.cpu_count()} cores"}
    up.start(out / "up.log")
    try:
        up.wait_ready(workers=2, timeout_s=600)
        secrets = add_keys(env)
        served = requests.get(up.url + "/v1/models", timeout=HTTP_TIMEOUT_S,
                              headers={"Authorization": f"Bearer {secrets['soak-a']}"})
        model_id = served.json()["data"][0]["id"]
        seen = Seen()
        # warm-up: one request of each kind, so the baseline has Redis's scripts and clients
        warm = Load(up, seen, "soak-a", secrets["soak-a"], 1, long_share=0, model=model_id,
                    kinds=(), seed=args.seed)
        for kind in ("job", "completion", "stream"):
            warm._one(kind, "warm-up", 8, 0)
        time.sleep(3)
        baseline = used_memory(up.redis())
        report["baseline_keys_by_kind"] = memory_by_kind(up.redis())
        seen = Seen()
        batch = Batch(up, secrets["soak-batch"], model_id, args.batch_lines)
        batch.start()
        rng = random.Random(args.seed)
        t0, t0_wall = time.monotonic(), time.time()
        injector = Injector(up, batch, rng, tuple(float(x) for x in args.fault_every.split(",")),
                            t0)
        mixed = ("job", "job", "completion", "stream", "cancel")
        loads = [Load(up, seen, k, secrets[k], args.rate, long_share=args.long_share,
                      model=model_id, kinds=mixed, seed=args.seed + i)
                 for i, k in enumerate(("soak-a", "soak-b"))]
        loads.append(Load(up, seen, "soak-flood", secrets["soak-flood"], args.flood_rate,
                          long_share=0, model=model_id, kinds=("job", "completion"),
                          seed=args.seed + 7))
        stop = threading.Event()
        with ThreadPoolExecutor(max_workers=256) as pool:
            threads = [threading.Thread(target=load.run, args=(pool, stop), daemon=True)
                       for load in loads]
            threads.append(threading.Thread(target=injector.run, args=(stop,), daemon=True))
            watching = threading.Event()
            watcher = Watcher(up, seen, secrets,
                              {lane.name: lane.queue_ttl_s + lane.deadline_s
                               for lane in load_lanes(LANES).lanes})
            follower = FinishedFollower(up)
            for target in (watcher.run, follower.run):
                threading.Thread(target=target, args=(watching,), daemon=True).start()
            for t in threads:
                t.start()
            stop.wait(args.duration)
            stop.set()
            for t in threads:
                t.join(FREEZE_S + 60)
        # the pool has drained: every request sent has its answer (or its client timeout)
        print(f"[soak] load stopped after {time.monotonic() - t0:.0f} s; draining", flush=True)
        up.wait_ready(workers=2, timeout_s=300)  # a fault's restart finished
        longest = max(lane.queue_ttl_s + lane.deadline_s for lane in load_lanes(LANES).lanes
                      if lane.priority != "batch")
        drained = drain(up, watcher, batch, timeout_s=longest + 600)
        watching.set()
        time.sleep(2)  # the follower's last blocking read returned
        follower.read()
        finished = follower.counts
        client = up.redis()
        line_jobs = set(finished) - set(seen.jobs)  # the batch's lines and the warm-up's
        # a delivery whose ack was lost is dropped by a redelivery pass once it is older than
        # TAILGUARD_REDELIVER_AFTER_S: at rest means after that pass had its turn
        counters = settled_counters(client, lanes, within_s=settings.REDELIVER_AFTER_S.get()
                                    + 3 * settings.WORKER_HEARTBEAT_S.get())
        memory = memory_back(client, baseline,
                             within_s=max(int(env[k]) for k in (settings.RECORD_TTL_S.env,
                                                                settings.STATS_RETENTION_S.env)) + 120)
        windows = injector.redis_down
        # a job whose message a killed or frozen worker had taken off its queue fails as
        # message_lost two redelivery passes later: readable, nothing ran (docs/reliability.md)
        lost_grace_s = settings.REDELIVER_AFTER_S.get() + 20
        unexpected_5xx = [e for e in seen.server_errors
                          if e["status"] != 503 or not (
                              expected_503(e["t"], windows) or e["code"] == "no_live_worker"
                              or (e["code"] == "message_lost"
                                  and expected_503(e["t"], injector.workers_down, lost_grace_s)))]
        report.update({
            "faults": [asdict(f) for f in injector.faults],
            "faults_injected": sum(1 for f in injector.faults
                                   if not f.answer.startswith("not injected")),
            "faults_by_kind": dict(Counter(f.kind for f in injector.faults)),
            "requests_by_outcome": dict(sorted(seen.outcomes.items())),
            "jobs_accepted": len(seen.jobs),
            "jobs_by_state": dict(Counter(drained["states"].values())),
            "stuck": sorted(watcher.open()) + sorted(drained["open_records"]),
            "lost": sorted(j for j in seen.jobs if finished[j] == 0),
            "twice": sorted(j for j, n in finished.items() if n > 1),
            # what a job finished twice went through: its entries' times (seconds since the
            # load began, next to the faults' t) and its record as it stands
            "twice_history": {j: {"entries_at_s": [round(int(e.split("-")[0]) / 1000 - t0_wall, 1)
                                                   for e in follower.entries[j]],
                                  "record": {k.decode(): v.decode(errors="replace")[:200] for k, v in
                                             client.hgetall(keys.job_key(j)).items()}}
                              for j, n in finished.items() if n > 1},
            "batch": batch.results(drained["batch"]),
            "batch_line_jobs_finished": len(line_jobs),
            "counters_at_rest": {k: v for k, v in counters.items() if v},
            "unacked_at_rest": unacked_deliveries(client),
            "memory": memory,
            "unexpected_5xx": unexpected_5xx,
            "unanswered": seen.unanswered,
            "past_promise": watcher.late,
        })
        report["failures"] = failures(report)
    finally:
        up.stop()
        (out / "soak.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps({k: v for k, v in report.items() if k != "faults"}, indent=1, default=str))
    print(f"report: {out / 'soak.json'}; the system's log: {out / 'up.log'}")
    return report


def failures(report: dict) -> list[str]:
    """Which of the soak's checks failed, in words."""
    out = []
    for name in ("stuck", "lost", "twice", "unexpected_5xx", "unanswered", "past_promise"):
        if report[name]:
            out.append(f"{name}: {len(report[name])}")
    batch = report["batch"]
    if batch["status"] != "completed" or batch["missing"] or batch["twice"]:
        out.append(f"batch: {batch}")
    if report["counters_at_rest"]:
        out.append(f"counters not at zero at rest: {report['counters_at_rest']} "
                   f"(unacked: {report['unacked_at_rest']})")
    if report["memory"]["ratio"] > 1.10:
        out.append(f"Redis memory {report['memory']['ratio']}x its baseline")
    return out


def main(argv: list[str] | None = None) -> int:
    report = run(parse(argv))
    print("FAILED: " + "; ".join(report["failures"]) if report.get("failures")
          else "soak: every check passed")
    return 1 if report.get("failures", ["not run to its end"]) else 0


if __name__ == "__main__":
    sys.exit(main())
