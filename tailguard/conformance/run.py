"""The compat workload run: `vllm serve`, then tailguard's lanes, on the same model, each sent
every check of ``compat`` with the official ``openai`` SDK (max_retries=0), then compared.

    tailguard bench --workload compat --out bench-results/compat

The two servers come up one after the other, as the bench brings up its `direct` and
`lanes` topologies (tailguard/bench/topology.py), so each has the machine to itself: vLLM's
own OpenAI server (as a user runs it: first come first served, the same served names and
TAILGUARD_OPENAI_ARGS), then tailguard's API and workers with the lanes file in force. The
model is the one `tailguard up` serves (TAILGUARD_MODEL, else the bundled SmolLM2-135M-Instruct,
whose chat template is real), or --model.

Every SDK request goes through an httpx event hook that counts it, its retries (the SDK's own
``x-stainless-retry-count`` header) and the answers a default-retrying SDK would retry (the
SDK's ``_should_retry``). On tailguard, each job an answer names is read back at the end
(``/v1/jobs/<id>``: how it ended), and /metrics' finished requests are read before and after.
Writes ``report.json``, ``report.md`` and ``answers.jsonl`` (every call and answer) under --out.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tailguard import settings
from tailguard.bench.compat import (
    COMPAT,
    TOOL_PARSER,
    Answer,
    Call,
    Check,
    Context,
    SideRun,
    by_name,
    compare,
    fill,
    fill_text,
    judge,
    render_text,
    skipped,
)
from tailguard.bench.topology import TopologyError

if TYPE_CHECKING:
    from tailguard.bench.run import BenchConfig

#: how long one call may take (an omitted max_tokens on vLLM's chat runs to a stop)
CALL_TIMEOUT_S = 300.0
#: how long tailguard's API may take to build vLLM's render layer after /healthz is green
RENDER_READY_S = 300.0
#: the words tried for the ordinary token of the logit_bias checks (the first that is one token)
TOKEN_WORDS = (" yes", " the", "yes", "a")


def log(msg: str) -> None:
    import sys

    print(f"tailguard bench: {msg}", file=sys.stderr, flush=True)


class Sender:
    """The official SDK against one server, every request counted by an httpx event hook."""

    def __init__(self, url: str, api_key: str = "unused", timeout_s: float = CALL_TIMEOUT_S) -> None:
        import openai

        self.url = url.rstrip("/")
        self.http = openai.DefaultHttpx2Client(
            timeout=timeout_s, event_hooks={"request": [self._on_request],
                                            "response": [self._on_response]})
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0,
                                    timeout=timeout_s, http_client=self.http)
        self.requests = self.retries = self.would_retry = 0

    def _on_request(self, request: Any) -> None:
        self.requests += 1
        if int(request.headers.get("x-stainless-retry-count") or 0) > 0:
            self.retries += 1

    def _on_response(self, response: Any) -> None:
        should = getattr(self.client, "_should_retry", None)
        retry = should(response) if should is not None else (
            response.status_code in (408, 409, 429) or response.status_code >= 500)
        self.would_retry += bool(retry)

    def close(self) -> None:
        self.client.close()

    def send(self, call: Call, ctx: Context) -> Answer:
        """`call`, its placeholders filled for `ctx`; a top-level None in its body is left out."""
        before = (self.requests, self.retries, self.would_retry)
        t0 = time.monotonic()
        answer = self._send(call, ctx)
        answer.seconds = time.monotonic() - t0
        answer.requests, answer.retries, answer.would_retry = (
            now - then for now, then in zip((self.requests, self.retries, self.would_retry),
                                            before, strict=True))
        return answer

    def _send(self, call: Call, ctx: Context) -> Answer:
        import openai

        body = {k: v for k, v in fill(dict(call.body or {}), ctx).items() if v is not None}
        headers = dict(call.headers)
        try:
            if call.route in ("completions", "chat"):
                return self._create(call, body, headers)
            if call.route == "models":
                raw = self.client.models.with_raw_response.list(extra_headers=headers)
                return _answer(raw.status_code, raw.headers, raw.text)
            if call.route == "get":
                resp = self.client.get(self.url + call.path, cast_to=self._raw_type(),
                                       options={"headers": headers})
                return _answer(resp.status_code, resp.headers, resp.text)
            if call.route == "post":
                resp = self.client.post(self.url + call.path, body=body, cast_to=self._raw_type(),
                                        options={"headers": headers})
                return _answer(resp.status_code, resp.headers, resp.text)
            # raw: bytes the SDK will not send (NaN), on the SDK's own HTTP client
            resp = self.http.post(self.url + call.path, content=fill_text(call.data, ctx).encode(),
                                  headers={"Content-Type": "application/json", **headers})
            return _answer(resp.status_code, resp.headers, resp.text)
        except openai.APIStatusError as exc:
            return _answer(exc.status_code, exc.response.headers, _read(exc.response))
        except openai.APIError as exc:  # no answer: connection refused, timeout
            return Answer(None, error=f"{type(exc).__name__}: {exc}")

    def _raw_type(self) -> Any:
        import httpx2

        return httpx2.Response

    def _create(self, call: Call, body: dict[str, Any], headers: dict[str, str]) -> Answer:
        """The SDK's typed create(): the fields it knows as arguments, the rest in extra_body
        (as a client sends vLLM's own fields); `model` left out when the body has none."""
        import inspect

        import openai

        resource = self.client.completions if call.route == "completions" else (
            self.client.chat.completions)
        known = set(inspect.signature(resource.create).parameters) - {
            "extra_headers", "extra_query", "extra_body", "timeout"}
        kwargs = {k: v for k, v in body.items() if k in known}
        extra = {k: v for k, v in body.items() if k not in known}
        kwargs.setdefault("model", openai.omit)
        kwargs.update(extra_headers=headers, extra_body=extra or None)
        if call.stream:
            with resource.with_streaming_response.create(**kwargs) as resp:
                lines = list(resp.iter_lines())
                return Answer(resp.status_code, _headers(resp.headers), events=_events(lines),
                              lines=lines)
        raw = resource.with_raw_response.create(**kwargs)
        return _answer(raw.status_code, raw.headers, raw.text)


def _read(response: Any) -> str:
    try:
        return response.text
    except Exception:  # noqa: BLE001 - a streamed error body not read yet
        response.read()
        return response.text


def _headers(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def _answer(status: int, headers: Any, text: str) -> Answer:
    try:
        body: Any = json.loads(text) if text else None
    except ValueError:
        body = text
    return Answer(status, _headers(headers), body=body)


def _events(lines: Sequence[str]) -> list[Any]:
    """A stream's ``data:`` payloads, parsed (``[DONE]`` kept as the string)."""
    out: list[Any] = []
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            out.append(payload)
            continue
        try:
            out.append(json.loads(payload))
        except ValueError:
            out.append(payload)
    return out


# ------------------------------------------------------------------------ one side


def context(sender: Sender, side: str, model_dir: str, capabilities: frozenset[str]) -> Context:
    """What `side`'s predicates need: the served model's id and context (GET /v1/models), and
    the tokens of the logit_bias checks (the model's own tokenizer)."""
    card = sender.client.models.list().data[0]
    token, token_text, special, special_text = tokens_of(model_dir)
    return Context(side=side, model=card.id,
                   max_model_len=int((card.model_extra or {}).get("max_model_len") or 0),
                   token=token, token_text=token_text, special=special,
                   special_text=special_text, capabilities=capabilities)


def tokens_of(model_dir: str) -> tuple[int, str, int, str]:
    """An ordinary token (id, text) and the end-of-sequence one, from the model's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    for word in TOKEN_WORDS:
        ids = tok.encode(word, add_special_tokens=False)
        if len(ids) == 1 and tok.decode(ids) == word:
            break
    else:
        raise ValueError(f"none of {TOKEN_WORDS} is one token of {model_dir}'s tokenizer")
    return ids[0], word, tok.eos_token_id, tok.eos_token


def run_side(sender: Sender, ctx: Context, checks: Sequence[Check],
             on_result: Callable[[Check, Any], None] | None = None) -> SideRun:
    """Every check against one server, one call at a time."""
    run = SideRun(ctx.side)
    for check in checks:
        skip = skipped(check, ctx)
        if skip is not None:
            run.answers[check.name], run.results[check.name] = [], skip
        else:
            answers = [sender.send(call, ctx) for call in check.calls]
            run.answers[check.name] = answers
            run.results[check.name] = judge(check, answers, ctx)
        if on_result is not None:
            on_result(check, run.results[check.name])
    return run


def job_statuses(url: str, job_ids: Sequence[str], wait_s: float = 60.0) -> dict[str, str]:
    """How each job ended (``/v1/jobs/<id>``), waiting a while for those still running."""
    out: dict[str, str] = {}
    deadline = time.monotonic() + wait_s
    for job in job_ids:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/v1/jobs/{job}", timeout=10) as resp:
                    status = json.loads(resp.read()).get("status", "unknown")
            except OSError as exc:
                status = f"unreadable ({exc})"
            if status not in ("queued", "running") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        out[job] = status
    return out


_FINISHED = re.compile(r'^tailguard_requests_total\{([^}]*)\}\s+(\S+)$', re.M)


def finished_by_status(url: str) -> dict[str, float]:
    """/metrics' finished requests (tailguard_requests_total), summed by status."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for labels, value in _FINISHED.findall(text):
        status = dict(re.findall(r'(\w+)="([^"]*)"', labels)).get("status", "")
        out[status] = out.get(status, 0.0) + float(value)
    return out


def wait_render_ready(url: str, timeout_s: float = RENDER_READY_S) -> None:
    """tailguard's /health is 200 once the API built vLLM's render layer."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TopologyError(f"{url}/health not 200 within {timeout_s:.0f} s: the API did not "
                                "build vLLM's render layer")
        time.sleep(1)


# ------------------------------------------------------------------------ the whole run


def capabilities_of(openai_args: Sequence[str]) -> frozenset[str]:
    """What TAILGUARD_OPENAI_ARGS lets both servers do that the checks ask about."""
    args = list(openai_args)
    parser = any(a == "--tool-call-parser" or a.startswith("--tool-call-parser=") for a in args)
    return frozenset({TOOL_PARSER} if parser and "--enable-auto-tool-choice" in args else ())


def run_compat(cfg: BenchConfig) -> dict[str, Any]:
    """`vllm serve`, then tailguard's lanes, every check against each; the report."""
    from tailguard.bench.run import machine
    from tailguard.bench.topology import (
        RunningDirect,
        RunningTopology,
        direct_spec,
        lanes_spec,
    )
    from tailguard.host.cores import Pinning
    from tailguard.host.devices import device_kind
    from tailguard.host.redis_server import free_port, start_redis
    from tailguard.lanes.table import default_lanes_path, load_lanes
    from tailguard.model.info import model_max_len, served_model_names, serving_dtype

    if cfg.model:
        model = cfg.model
    else:
        from tailguard.model.served import prepare_served_model

        log("preparing the served model (the first run converts the bundled one)")
        model = prepare_served_model().path
    checks = by_name(cfg.compat_checks)
    lanes_path = Path(cfg.lanes_file or settings.LANES_FILE.get() or default_lanes_path())
    table = load_lanes(lanes_path)
    kind = device_kind()
    cores = sorted(cfg.cores or os.sched_getaffinity(0))
    lanes_topo = lanes_spec(table, lanes_path.read_text(), kind=kind, cores=cores)
    openai_args = tuple(settings.OPENAI_ARGS.get())
    names = served_model_names(model, settings.SERVED_MODEL_NAME.get())
    pin = (Pinning(cores=tuple(c for w in lanes_topo.workers for c in w.pin.cores))
           if kind == "cpu" else lanes_topo.workers[0].pin)
    direct = replace(direct_spec(pin, lanes_topo.workers, table, max_model_len=model_max_len(model),
                                 dtype=serving_dtype(model, settings.DTYPE.get()),
                                 cpus=tuple(cores) if kind == "cpu" else ()),
                     scheduling_policy="fcfs",
                     extra_args=("--served-model-name", *names, *openai_args))
    capabilities = capabilities_of(openai_args)
    out = Path(cfg.out_dir or settings.home() / "bench" / time.strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    config = {"workload": COMPAT, "model": model, "served_names": names, "device": kind,
              "cores": cores, "lanes_file": str(lanes_path), "openai_args": list(openai_args),
              "capabilities": sorted(capabilities), "checks": len(checks),
              "machine": machine(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "out_dir": str(out), "direct": direct.to_dict(), "lanes": lanes_topo.to_dict()}
    log(f"compat: {len(checks)} checks against vllm serve, then tailguard's lanes, model "
        f"{names[0]} ({model}); output in {out}")

    def progress(side: str) -> Callable[[Check, Any], None]:
        def say(check: Check, result: Any) -> None:
            if cfg.progress:
                log(f"[{side}] {check.name}: {result.status} ({result.detail[:100]})")
        return say

    sides: dict[str, SideRun] = {}
    # vLLM first: no Redis, nothing of tailguard's running
    topo: RunningTopology = RunningDirect(direct, model=model, workdir=out / "direct",
                                          api_port=free_port())
    try:
        log(f"[vllm] starting vllm serve on cores {cores}")
        url = topo.start(cfg.start_timeout_s)
        sender = Sender(url)
        try:
            ctx = context(sender, "vllm", model, capabilities)
            log(f"[vllm] up: model {ctx.model}, context {ctx.max_model_len}")
            sides["vllm"] = run_side(sender, ctx, checks, progress("vllm"))
        finally:
            sender.close()
    finally:
        log("[vllm] stopping")
        topo.stop()

    redis_dir = Path(tempfile.mkdtemp(prefix="tailguard-bench-redis-"))
    redis_port = free_port()
    redis_proc = start_redis(redis_port, redis_dir, appendonly=False, log_path=out / "redis.log",
                             cpus=lanes_topo.frontend)
    try:
        topo = RunningTopology(lanes_topo, model=model, redis_url=f"redis://127.0.0.1:{redis_port}/0",
                               workdir=out / "lanes", api_port=free_port())
        try:
            log("[tailguard] starting: " + "; ".join(
                f"{w.name} serves {','.join(w.lanes)} on {w.pin.label()}" for w in lanes_topo.workers))
            url = topo.start(cfg.start_timeout_s)
            wait_render_ready(url)
            before = finished_by_status(url)
            sender = Sender(url)
            try:
                ctx = context(sender, "tailguard", model, capabilities)
                log(f"[tailguard] up: model {ctx.model}, context {ctx.max_model_len}")
                run = sides["tailguard"] = run_side(sender, ctx, checks, progress("tailguard"))
            finally:
                sender.close()
            jobs = sorted({a.job_id for a in run.answer_list() if a.job_id})
            run.jobs = job_statuses(url, jobs)
            time.sleep(2)  # the finished-request counters follow the jobs' ends
            after = finished_by_status(url)
            run.finished_by_status = {s: after.get(s, 0.0) - before.get(s, 0.0)
                                      for s in sorted(set(after) | set(before))}
        finally:
            log("[tailguard] stopping")
            topo.stop()
    finally:
        redis_proc.stop()
        shutil.rmtree(redis_dir, ignore_errors=True)
    return write_report(out, config, checks, sides)


def write_report(out: Path, config: dict[str, Any], checks: Sequence[Check],
                 sides: dict[str, SideRun]) -> dict[str, Any]:
    body = compare(checks, sides["vllm"], sides["tailguard"])
    report: dict[str, Any] = {
        "config": config, "workload": {"name": COMPAT}, "compat": body,
        "targets": body["targets"],
        "sides": {side: {"counts": run.counts(), "sdk_requests": run.sdk_requests(),
                         "retries": run.retries(), "would_retry": run.would_retry(),
                         "jobs": run.jobs, "finished_by_status": run.finished_by_status}
                  for side, run in sides.items()}}
    files = {"json": out / "report.json", "text": out / "report.md",
             "answers": out / "answers.jsonl"}
    with open(files["answers"], "w") as fh:
        for check in checks:
            for side, run in sides.items():
                fh.write(json.dumps({
                    "check": check.name, "side": side, "result": run.results[check.name].to_dict(),
                    "calls": [{"route": c.route, "path": c.path, "body": c.body, "data": c.data,
                               "headers": dict(c.headers)} for c in check.calls],
                    "answers": [a.to_dict() for a in run.answers[check.name]]},
                    ensure_ascii=False, default=str) + "\n")
    report["files"] = {k: str(v) for k, v in files.items()}
    files["json"].write_text(json.dumps(report, indent=1, ensure_ascii=False, default=str) + "\n")
    files["text"].write_text(render_text(report))
    return report


__all__ = ["Sender", "run_compat", "run_side", "write_report"]
