"""The whole system for the Redis and API fault tests: a private Redis (with its AOF), the
API under gunicorn and the short worker, as processes a test can stop, kill or freeze;
clients that submit and stream over HTTP; and the invariants every fault test asserts:
every accepted job terminal, each counted once in the finished stream, none cancelled by
the fault, and new requests served afterwards.

Measured figures (time to terminal after a fault, how the API answered meanwhile) are
printed as `FAULT-FIGURE {...}` lines: run with `-s` to read them (docs/reliability.md).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import requests
from conftest import ROOT
from e2e_fixtures import engine_pin, http_status, or_fail
from fault_workers import finished_jobs

from tailguard import settings
from tailguard.host.procs import Child, ChildSpec, start, tailguard_argv, wait_until, worker_spec
from tailguard.host.redis_server import free_port, start_redis
from tailguard.jobs.store import CANCELLED, TERMINAL
from tailguard.redis import keys

#: How long a client waits for one answer: far above the API's bounded Redis calls, so a
#: request that hangs shows up as a timeout, not as a slow success.
HTTP_TIMEOUT_S = 20


def figure(**values) -> None:
    print("FAULT-FIGURE " + json.dumps(values), flush=True)


@dataclass
class System:
    """A private Redis (with its AOF), the API under gunicorn, and the short worker."""

    data: Path
    logs: Path
    redis_port: int
    api_port: int
    env: dict[str, str]
    redis: Child | None = None
    api: Child | None = None
    worker: Child | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.redis_port, socket_timeout=10)

    def start_redis(self) -> None:
        self.redis = start_redis(self.redis_port, self.data, appendonly=True,
                                 log_path=self.logs / "redis.log")

    def start_api(self) -> None:
        self.api = start(ChildSpec("api", tailguard_argv("api", "--port", str(self.api_port)),
                                   env=self.env, cwd=ROOT), log=self.logs / "api.log", append=True)
        # up, and vLLM's render layer built (/health): an OpenAI call before it waits for the
        # build, which a loaded machine can make longer than a fault test's HTTP timeout
        or_fail(lambda: wait_until(lambda: http_status(self.url + "/health") == 200,
                                   [self.api], 300, "API up, its OpenAI routes ready"),
                cleanup=self.api.stop)

    def start_worker(self) -> None:
        spec = worker_spec("short", engine_pin(0), "-l", "INFO", env=self.env)
        self.worker = start(ChildSpec(spec.name, spec.argv, env=spec.env, cwd=ROOT),
                            log=self.logs / "worker.log")
        or_fail(lambda: wait_until(self.short_served, [self.worker, self.redis], 300,
                                   "short worker serving"), cleanup=self.stop)

    def short_served(self) -> bool:
        try:
            body = requests.get(self.url + "/healthz", timeout=5).json()
        except (requests.RequestException, ValueError):
            return False
        return body.get("workers_per_lane", {}).get("short", 0) > 0

    def stop(self) -> None:
        """The end of a test: the worker killed (its warm stop is no fault test's business and
        takes seconds of vLLM's teardown), the API and Redis stopped."""
        if self.worker is not None:
            self.worker.kill()
        for child in (self.api, self.redis):
            if child is not None:
                child.stop()

    def log_tails(self) -> str:
        return "\n".join(c.log_tail() for c in (self.api, self.worker, self.redis) if c)


def system_fixture(tmp_path_factory, tiny_model, *, worker: bool) -> System:
    data = tmp_path_factory.mktemp("faults-redis")
    sys_ = System(data=data, logs=data, redis_port=free_port(), api_port=free_port(), env={})
    sys_.env = {settings.REDIS_URL.env: f"redis://127.0.0.1:{sys_.redis_port}/0",
                settings.MODEL.env: tiny_model, settings.WORKER_HEARTBEAT_S.env: "1",
                settings.WORKER_LOST_GRACE_S.env: "5"}
    if not worker:
        # no worker serves the lanes: queue requests (as a worker-less API test wants) instead
        # of refusing them 503 no_live_worker
        sys_.env[settings.ADMIT_WITHOUT_WORKER.env] = "1"
    sys_.start_redis()
    sys_.start_api()
    if worker:
        sys_.start_worker()
    return sys_


@dataclass
class Load:
    """Submits a short job every `every_s` until stopped, remembering what was accepted and
    how the API answered otherwise (status, Retry-After, seconds taken)."""

    url: str
    every_s: float = 0.25
    accepted: list[str] = field(default_factory=list)
    refused: list[tuple[int | str, str | None, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Load:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            t0 = time.monotonic()
            try:
                resp = requests.post(self.url + "/v1/jobs", timeout=HTTP_TIMEOUT_S,
                                     json={"prompt": f"fault load {i}", "max_tokens": 48})
            except requests.RequestException as exc:
                self.refused.append((type(exc).__name__, None, time.monotonic() - t0))
            else:
                if resp.status_code == 202:
                    self.accepted.append(resp.json()["id"])
                else:
                    self.refused.append((resp.status_code, resp.headers.get("Retry-After"),
                                         time.monotonic() - t0))
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(HTTP_TIMEOUT_S + 5)


def submit(url: str, **body) -> str:
    resp = requests.post(url + "/v1/jobs", json={"prompt": "hello there", "max_tokens": 48, **body},
                         timeout=HTTP_TIMEOUT_S)
    assert resp.status_code == 202, resp.text
    return resp.json()["id"]


def sse_events(resp: requests.Response):
    """(id, event, data) of each event of an open SSE response, as they arrive."""
    fields: dict[str, str] = {}
    for line in resp.iter_lines(decode_unicode=True):
        if line:
            if not line.startswith(":"):
                key, _, value = line.partition(": ")
                fields[key] = value
            continue
        if "data" in fields:
            data = fields["data"]
            yield fields.get("id"), fields.get("event"), (data if data == "[DONE]" else json.loads(data))
        fields = {}


class NativeStream(threading.Thread):
    """Follows /v1/jobs/<id>/stream to its end event, resuming with Last-Event-ID after an
    error event or a dropped connection, as an SSE client does."""

    def __init__(self, url: str, job_id: str, *, resume_within_s: float = 120) -> None:
        super().__init__(daemon=True)
        self.url, self.job_id, self.resume_within_s = url, job_id, resume_within_s
        self.text, self.end, self.errors, self.resumes, self.last_id = "", None, [], 0, None

    def run(self) -> None:
        give_up = time.monotonic() + self.resume_within_s
        while self.end is None and time.monotonic() < give_up:
            headers = {"Last-Event-ID": self.last_id} if self.last_id else {}
            try:
                with requests.get(f"{self.url}/v1/jobs/{self.job_id}/stream", headers=headers,
                                  stream=True, timeout=HTTP_TIMEOUT_S) as resp:
                    if resp.status_code != 200:
                        self.errors.append(resp.status_code)
                    else:
                        for ev_id, event, data in sse_events(resp):
                            if event == "error":
                                self.errors.append(data["error"]["code"])
                                break
                            self.last_id = ev_id
                            if event == "delta":
                                self.text += data["text"]
                            elif event == "end":
                                self.end = data
            except requests.RequestException as exc:
                self.errors.append(type(exc).__name__)
            if self.end is None:
                self.resumes += 1
                time.sleep(0.5)


def wait_openai_ready(url: str, timeout_s: float = 300) -> None:
    """Until the API's OpenAI routes can serve: vLLM's /health is 200 once the process's render
    layer is built (importing vLLM takes a while after the API starts)."""
    deadline = time.monotonic() + timeout_s
    while requests.get(url + "/health", timeout=HTTP_TIMEOUT_S).status_code != 200:
        assert time.monotonic() < deadline, f"the API's render layer was not built in {timeout_s} s"
        time.sleep(0.5)


class OpenAIStream(threading.Thread):
    """One streaming /v1/completions call: its chunks, and how it ended."""

    def __init__(self, url: str, model: str, prompt: str = "openai stream") -> None:
        super().__init__(daemon=True)
        self.url, self.model, self.prompt = url, model, prompt
        self.job_id, self.chunks, self.done, self.error = None, 0, False, None

    def run(self) -> None:
        try:
            with requests.post(self.url + "/v1/completions", stream=True, timeout=HTTP_TIMEOUT_S,
                               json={"model": self.model, "prompt": self.prompt, "max_tokens": 64,
                                     "stream": True}) as resp:
                self.job_id = resp.headers.get("X-Tailguard-Job-Id")
                if resp.status_code != 200:
                    self.error = resp.status_code
                    return
                for _id, _event, data in sse_events(resp):
                    if data == "[DONE]":
                        self.done = True
                    elif "error" in data:
                        self.error = data["error"]["code"]
                    else:
                        self.chunks += 1
        except requests.RequestException as exc:
            self.error = type(exc).__name__


def wait_terminal(client: redis.Redis, ids: list[str], url: str, timeout_s: float) -> dict[str, dict]:
    """Each job's record once every one is terminal (read through the API, which settles
    overdue jobs); fails with the statuses still open after `timeout_s`."""
    jobs: dict[str, dict] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        for job_id in ids:
            if job_id not in jobs or jobs[job_id]["status"] not in TERMINAL:
                resp = requests.get(f"{url}/v1/jobs/{job_id}", timeout=HTTP_TIMEOUT_S)
                assert resp.status_code == 200, (job_id, resp.status_code, resp.text)
                jobs[job_id] = resp.json()
        open_ = Counter(j["status"] for j in jobs.values() if j["status"] not in TERMINAL)
        if not open_:
            return jobs
        if time.monotonic() > deadline:
            stuck = {j: where_is(client, j) for j, job in jobs.items()
                     if job["status"] not in TERMINAL}
            pytest.fail(f"jobs not terminal {timeout_s:.0f} s after the fault: {dict(open_)}; "
                        f"where their messages are: {stuck}", pytrace=False)
        time.sleep(0.5)


def where_is(client: redis.Redis, job_id: str) -> dict:
    """Where a job's Celery message is (the lanes' Redis lists, kombu's unacked hash) and its
    record: what a test that finds a job stuck prints, so the failure says which part lost it."""
    found: dict = {"record": {k.decode(): v.decode() for k, v in
                              client.hgetall(keys.job_key(job_id)).items()
                              if k in (b"status", b"lane", b"submitted_at", b"expires_at")}}
    for key in client.scan_iter(count=1000):
        if client.type(key) == b"list":
            hits = [i for i, m in enumerate(client.lrange(key, 0, -1)) if job_id.encode() in m]
            if hits:
                found.setdefault("lists", {})[key.decode()] = hits
    for tag, raw in client.hgetall("unacked").items():
        if job_id.encode() in raw:
            found.setdefault("unacked", []).append(
                {"tag": tag.decode(), "delivered_at": client.zscore("unacked_index", tag)})
    found["now"] = time.time()
    return found


def finished_counts(client: redis.Redis) -> Counter:
    """How often each job appears in the finished stream (once per terminal transition)."""
    return Counter(finished_jobs(client))


def assert_invariants(client: redis.Redis, jobs: dict[str, dict]) -> None:
    """Accepted = finished, each exactly once; none cancelled (no client asked for it)."""
    counts = finished_counts(client)
    assert {j: counts[j] for j in jobs} == {j: 1 for j in jobs}
    assert [j for j, job in jobs.items() if job["status"] == CANCELLED] == []


def serves_again(url: str) -> None:
    job_id = submit(url)
    resp = requests.get(f"{url}/v1/jobs/{job_id}?wait=30", timeout=HTTP_TIMEOUT_S + 40)
    assert resp.json()["status"] == "succeeded", resp.text
