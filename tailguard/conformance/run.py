"""The conformance run: `vllm serve`, then tailguard's lanes, on the same model, each sent every
check of ``catalog`` with the official ``openai`` SDK (max_retries=0), then compared.

    tailguard conformance --out DIR [--checks a,b] [--check]

The two servers come up one after the other, as the bench brings up its `direct` and
`lanes` topologies (tailguard/bench/topology.py), so each has the machine to itself: vLLM's
own OpenAI server (as a user runs it: first come first served, the same served names and
TAILGUARD_OPENAI_ARGS), then tailguard's API and workers with the lanes file in force. The
model is the one `tailguard up` serves (TAILGUARD_MODEL, else the bundled SmolLM2-135M-Instruct,
whose chat template is real), or --model.

Every SDK request is counted (``sender``). On tailguard, each job an answer names is read back
at the end (``/v1/jobs/<id>``: how it ended), and /metrics' finished requests are read before
and after. Writes ``report.json``, ``report.md`` and ``answers.jsonl`` (every call and answer)
under --out.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tailguard import settings
from tailguard.bench.topology import (
    DirectSpec,
    RunningDirect,
    RunningTopology,
    TopologyError,
    TopologySpec,
    direct_spec,
    lanes_spec,
)
from tailguard.conformance.catalog import by_name
from tailguard.conformance.check import TOOL_PARSER, Check, Context, judge, skipped
from tailguard.conformance.compare import SideRun, compare, render_text
from tailguard.conformance.sender import Sender

#: the report's workload name; `tailguard bench --workload compat` is the old spelling of
#: `tailguard conformance` (deprecated: it runs this)
COMPAT = "compat"
#: how long tailguard's API may take to build vLLM's render layer after /healthz is green
RENDER_READY_S = 300.0
#: the words tried for the ordinary token of the logit_bias checks (the first that is one token)
TOKEN_WORDS = (" yes", " the", "yes", "a")


@dataclass(frozen=True)
class ConformanceConfig:
    """What `tailguard conformance` takes (tailguard/cli.py: one option each)."""

    model: str | None = None  # default: what `tailguard up` serves
    checks: tuple[str, ...] | None = None  # default: all
    cores: tuple[int, ...] | None = None  # default: all
    lanes_file: Path | None = None  # default: $TAILGUARD_LANES or the shipped one
    out_dir: Path | None = None  # default: $TAILGUARD_HOME/conformance/<time>
    progress: bool = True
    start_timeout_s: float = 600.0


def log(msg: str) -> None:
    print(f"tailguard conformance: {msg}", file=sys.stderr, flush=True)


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


def run_conformance(cfg: ConformanceConfig) -> dict[str, Any]:
    """`vllm serve`, then tailguard's lanes, every check against each; the report (also written
    under cfg.out_dir). SIGTERM stops it like Ctrl-C: the servers it started are stopped too."""
    from tailguard.host.procs import stop_signals

    with stop_signals():
        return _run(cfg)


@dataclass(frozen=True)
class _Plan:
    """What the run brings up, where, and the report's config."""

    model: str
    checks: tuple[Check, ...]
    direct: DirectSpec  # vLLM's own server
    lanes: TopologySpec  # tailguard with the lanes file in force
    capabilities: frozenset[str]
    out: Path
    config: dict[str, Any]


def _plan(cfg: ConformanceConfig) -> _Plan:
    """The model, the checks, both servers' specs on the same cores, and the report's config."""
    from tailguard.bench.run import machine
    from tailguard.host.cores import Pinning
    from tailguard.host.devices import device_kind
    from tailguard.lanes.table import default_lanes_path, load_lanes
    from tailguard.model.info import model_max_len, served_model_names, serving_dtype

    if cfg.model:
        model = cfg.model
    else:
        from tailguard.model.served import prepare_served_model

        log("preparing the served model (the first run converts the bundled one)")
        model = prepare_served_model().path
    checks = by_name(cfg.checks)
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
    out = Path(cfg.out_dir or settings.home() / "conformance" / time.strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    config = {"workload": COMPAT, "model": model, "served_names": names, "device": kind,
              "cores": cores, "lanes_file": str(lanes_path), "openai_args": list(openai_args),
              "capabilities": sorted(capabilities), "checks": len(checks),
              "machine": machine(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "out_dir": str(out), "direct": direct.to_dict(), "lanes": lanes_topo.to_dict()}
    log(f"{len(checks)} checks against vllm serve, then tailguard's lanes, model "
        f"{names[0]} ({model}); output in {out}")
    return _Plan(model, checks, direct, lanes_topo, capabilities, out, config)


def _run(cfg: ConformanceConfig) -> dict[str, Any]:
    plan = _plan(cfg)
    sides = {"vllm": _vllm_side(cfg, plan), "tailguard": _tailguard_side(cfg, plan)}
    return write_report(plan.out, plan.config, plan.checks, sides)


def _progress(cfg: ConformanceConfig, side: str) -> Callable[[Check, Any], None]:
    def say(check: Check, result: Any) -> None:
        if cfg.progress:
            log(f"[{side}] {check.name}: {result.status} ({result.detail[:100]})")
    return say


def _vllm_side(cfg: ConformanceConfig, plan: _Plan) -> SideRun:
    """vLLM's own OpenAI server, every check against it; first: no Redis, nothing of
    tailguard's running."""
    from tailguard.host.redis_server import free_port

    topo = RunningDirect(plan.direct, model=plan.model, workdir=plan.out / "direct",
                         api_port=free_port())
    try:
        log(f"[vllm] starting vllm serve on cores {plan.config['cores']}")
        url = topo.start(cfg.start_timeout_s)
        sender = Sender(url)
        try:
            ctx = context(sender, "vllm", plan.model, plan.capabilities)
            log(f"[vllm] up: model {ctx.model}, context {ctx.max_model_len}")
            return run_side(sender, ctx, plan.checks, _progress(cfg, "vllm"))
        finally:
            sender.close()
    finally:
        log("[vllm] stopping")
        topo.stop()


def _tailguard_side(cfg: ConformanceConfig, plan: _Plan) -> SideRun:
    """tailguard's API and workers on a Redis of their own, every check against them, then
    how each job an answer named ended and /metrics' finished requests over the run."""
    from tailguard.host.redis_server import free_port, start_redis

    redis_dir = Path(tempfile.mkdtemp(prefix="tailguard-conformance-redis-"))
    redis_port = free_port()
    redis_proc = start_redis(redis_port, redis_dir, appendonly=False,
                             log_path=plan.out / "redis.log", cpus=plan.lanes.frontend)
    try:
        topo = RunningTopology(plan.lanes, model=plan.model,
                               redis_url=f"redis://127.0.0.1:{redis_port}/0",
                               workdir=plan.out / "lanes", api_port=free_port(),
                               worker_metrics_ports={w.name: free_port()
                                                     for w in plan.lanes.workers})
        try:
            log("[tailguard] starting: " + "; ".join(
                f"{w.name} serves {','.join(w.lanes)} on {w.pin.label()}" for w in plan.lanes.workers))
            url = topo.start(cfg.start_timeout_s)
            wait_render_ready(url)
            before = finished_by_status(url)
            sender = Sender(url, metrics_urls=topo.worker_metrics_urls)
            try:
                ctx = context(sender, "tailguard", plan.model, plan.capabilities)
                log(f"[tailguard] up: model {ctx.model}, context {ctx.max_model_len}")
                run = run_side(sender, ctx, plan.checks, _progress(cfg, "tailguard"))
            finally:
                sender.close()
            jobs = sorted({a.job_id for a in run.answer_list() if a.job_id})
            run.jobs = job_statuses(url, jobs)
            time.sleep(2)  # the finished-request counters follow the jobs' ends
            after = finished_by_status(url)
            run.finished_by_status = {s: after.get(s, 0.0) - before.get(s, 0.0)
                                      for s in sorted(set(after) | set(before))}
            return run
        finally:
            log("[tailguard] stopping")
            topo.stop()
    finally:
        redis_proc.stop()
        shutil.rmtree(redis_dir, ignore_errors=True)


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


__all__ = ["COMPAT", "ConformanceConfig", "run_conformance", "run_side", "write_report"]
