"""The `tailguard plan` command (registered by tailguard/cli.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import click

from tailguard.errors import ConfigError
from tailguard.lanes.affinity import Affinity
from tailguard.lanes.table import default_lanes_path, load_lanes
from tailguard.plan.prefix import KV_TOKENS
from tailguard.plan.search import (
    Plan,
    Targets,
    evaluate,
    least_engines,
    split_fleet,
    topology,
)
from tailguard.plan.sim import EngineGroup
from tailguard.plan.stepmodel import StepModel
from tailguard.plan.workload import ClassLoad, load_classes, parse_class


def _cores(text: str | None) -> tuple[int, ...]:
    return tuple(int(c) for c in text.split(",")) if text else ()


def _validate_runs(model: StepModel, run_dirs: tuple[Path, ...], as_json: bool) -> None:
    """`--validate-runs`: each bench run's topologies against the simulator (plan/validate.py)."""
    from tailguard.plan.validate import render_runs, run_rows

    if not run_dirs:
        raise click.UsageError("--validate-runs wants bench run directories after it")
    try:
        rows = [row for d in run_dirs for row in run_rows(d, model)]
    except (ValueError, ConfigError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(rows, indent=2) if as_json else render_runs(rows))


def _target(text: str) -> tuple[str, float]:
    name, _, value = text.partition(":")
    try:
        return name, float(value)
    except ValueError:
        raise click.BadParameter(f"want CLASS:SECONDS, got {text!r}") from None


@click.command()
@click.option("--profile", "profile_out", type=click.Path(dir_okay=False, path_type=Path),
              help="measure the engine (the served model, or the demo model) and write its step "
                   "model to this JSON file, then exit")
@click.option("--cores", help="with --profile: pin the engine to these cores, e.g. 1")
@click.option("--neighbour-cores", help="with --profile: also measure the engine beside a busy "
                                        "one on these cores (another lane's), e.g. 1")
@click.option("--frontend-cores", default="auto", show_default=True,
              help="with --profile: this process's own threads (a worker's beside its engine) on "
                   "these cores, an engine there at TAILGUARD_ENGINE_NICE, as `tailguard up` "
                   "places them (tailguard/host/cores.py): auto (the --neighbour-cores, the last "
                   "worker's), none (anywhere) or a core list")
@click.option("--step-model", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="the step model JSON that --profile wrote")
@click.option("--frontend-from", "frontend_report",
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="with --step-model: fit the front end's CPU per request and per output token "
                   "from a bench run's report.json (its phases' front-end CPU seconds), write "
                   "them into the step model file, then exit")
@click.option("--class", "class_specs", multiple=True, metavar="NAME:RATE:PROMPT:OUTPUT[:PRIORITY]",
              help="a request class: req/s, prompt and output tokens (repeat per class)")
@click.option("--workload", "workload_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="a JSONL trace (the bench's format) or `tailguard stats --json` output")
@click.option("--rate", type=float, help="total req/s for a trace without arrival_s")
@click.option("--scale", type=float, default=1.0, show_default=True,
              help="multiply every class's rate")
@click.option("--lanes", "lanes_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="lanes file (default: $TAILGUARD_LANES or the packaged one)")
@click.option("--topology", "topology_name", type=click.Choice(["lanes", "shared"]), default="lanes",
              show_default=True, help="lanes: the file's worker groups; shared: one lane for all")
@click.option("--target", "target_specs", multiple=True, metavar="CLASS:SECONDS",
              help="bound on a class's end-to-end P99, e.g. short:0.5")
@click.option("--max-queue-s", type=float, default=10.0, show_default=True,
              help="classes without a target: bound on their queue wait P99 (keeps up)")
@click.option("--engines", type=int, help="a fleet of N engines: how it splits")
@click.option("--split", help="simulate this split instead of searching: engines per worker "
                              "group in file order, e.g. 1,1")
@click.option("--duration", type=float, default=300.0, show_default=True,
              help="simulated seconds of arrivals")
@click.option("--seed", type=int, default=0, show_default=True,
              help="random draw of arrivals and lengths (with --validate: Poisson arrivals "
                   "instead of the bench runs' own)")
@click.option("--validate", is_flag=True,
              help="predicted vs measured for the bench runs of docs/benchmarks.md, each with "
                   "the lanes file it ran with (--lanes does not apply)")
@click.option("--validate-runs", is_flag=True,
              help="predicted vs measured for the bench run directories given after it (each "
                   "with report.json and samples.jsonl): the requests each topology accepted in "
                   "its mixed phase replayed on the simulator's matching setup (lanes: fleet, "
                   "fleet: router), the front end on the engine whose cores it shared, e.g. "
                   "--validate-runs /tmp/run1 /tmp/run2")
@click.argument("run_dirs", nargs=-1, type=click.Path(file_okay=False, path_type=Path))
@click.option("--compare-fleet", "compare_gpus", metavar="GPUS",
              help="tailguard's fleet (a central queue per lane, per-engine limits), one shared "
                   "FCFS engine per GPU, a router fleet and static lanes on a window of the Azure "
                   "trace, for fleets of these GPU counts, e.g. 8,64 (the lanes file: --lanes, "
                   "else the packaged GPU one; --duration defaults to 60 here)")
@click.option("--per-gpu", default="1,2,3,4", show_default=True,
              help="with --compare-fleet: the trace's requests per second per GPU, each a run "
                   "(with --prefix-cache: the workload's, default 8,16)")
@click.option("--prefix-cache", "prefix_gpus", metavar="GPUS",
              help="the prefix cache on fleets of these GPU counts, e.g. 8,64: its hit rate and "
                   "the TTFT of the chat and shared-doc workloads (tailguard bench's) with any "
                   "free engine taking a request (today) and with prefix affinity "
                   "(tailguard/lanes/affinity.py); --duration defaults to 60 here")
@click.option("--kv-cache-tokens", type=int, default=KV_TOKENS, show_default=True,
              help="with --prefix-cache: each engine's prefix cache, in tokens")
@click.option("--affinity-extra", type=int, default=Affinity().max_extra, show_default=True,
              help="with --prefix-cache: a prefix's engine is passed over when it runs (and has "
                   "offered) more than this many requests above the least loaded engine")
@click.option("--keda", "keda_rates", metavar="RATES",
              help="the engines the fleet needs at each of these loads (requests/s of the Azure "
                   "trace window, e.g. 8,32,128) to keep the short P99 within --target (default "
                   "short:4) and the long TTFT P99 within 10 s, and the backlog-tokens-per-worker "
                   "threshold and min/max replicas of a KEDA ScaledObject (--duration defaults to "
                   "60 here)")
@click.option("--max-running", "max_running_specs", multiple=True, metavar="LANE=N[,N...]",
              help="with --compare-fleet or --keda: the fleet's per-engine limit of a lane "
                   "instead of the lanes file's max_running; several values: a fleet row each")
@click.option("--max-ahead", "max_ahead_specs", multiple=True, metavar="LANE=N[,N...]",
              help="with --compare-fleet: the fleet's max_ahead of a lane (its requests start on "
                   "an engine running fewer than N of the lanes ahead of it) instead of the "
                   "lanes file's; several values: a fleet row each (with each --max-running)")
@click.option("--engine-slots", type=int,
              help="with --compare-fleet or --keda: the fleet's engines run at most this many "
                   "requests (max_num_seqs; default the largest lane's)")
@click.option("--token-scale", type=float, default=1.0, show_default=True,
              help="with --compare-fleet or --keda: the trace's prompt and output tokens x this")
@click.option("--by-key", is_flag=True,
              help="each --class is one API key's traffic: the lanes dispatch in fair order by "
                   "key, as the API does in keys mode (docs/lanes.md, fair share by key)")
@click.option("--weight", "weight_specs", multiple=True, metavar="CLASS=W",
              help="with --by-key: that key's weight (default 1), as `tailguard keys add --weight`")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def plan(profile_out: Path | None, cores: str | None, neighbour_cores: str | None,
         frontend_cores: str, step_model: Path | None, frontend_report: Path | None,
         class_specs: tuple[str, ...], workload_file: Path | None, rate: float | None, scale: float,
         lanes_file: Path | None, topology_name: str, target_specs: tuple[str, ...], max_queue_s: float,
         engines: int | None, split: str | None, duration: float, seed: int,
         validate: bool, validate_runs: bool, run_dirs: tuple[Path, ...],
         compare_gpus: str | None, per_gpu: str, prefix_gpus: str | None,
         kv_cache_tokens: int, affinity_extra: int,
         keda_rates: str | None, max_running_specs: tuple[str, ...],
         max_ahead_specs: tuple[str, ...], engine_slots: int | None, token_scale: float,
         by_key: bool, weight_specs: tuple[str, ...], as_json: bool) -> None:
    """How many engines each lane needs: a simulation of the lanes and of continuously
    batching engines whose step time comes from `--profile`."""
    # long for its parameters (click passes every option of every mode here); each mode's
    # work is a function of its own
    given = click.get_current_context().get_parameter_source
    seed_given = given("seed").name != "DEFAULT"
    if run_dirs and not validate_runs:
        raise click.UsageError(f"unexpected argument {str(run_dirs[0])!r} (run directories go "
                               "with --validate-runs)")
    if profile_out:
        _profile(profile_out, cores, neighbour_cores, frontend_cores)
        return
    if step_model is None:
        raise click.UsageError("give --step-model FILE (from `tailguard plan --profile FILE`)")
    model = StepModel.load(step_model)
    if frontend_report:
        _fit_frontend(model, step_model, frontend_report)
        return
    if validate:
        from tailguard.plan.validate import render, table_rows

        rows = table_rows(model, seed if seed_given else None)
        click.echo(json.dumps(rows, indent=2) if as_json else render(rows))
        return
    if validate_runs:
        _validate_runs(model, run_dirs, as_json)
        return
    trace_s = duration if given("duration").name != "DEFAULT" else 60.0
    if compare_gpus:
        _compare(model, compare_gpus, lanes_file, per_gpu, _max_running(max_running_specs),
                 _max_running(max_ahead_specs, "--max-ahead"), engine_slots, token_scale,
                 trace_s, seed, as_json)
        return
    if prefix_gpus:
        _prefix(model, prefix_gpus, lanes_file,
                per_gpu if given("per_gpu").name != "DEFAULT" else "8,16", kv_cache_tokens,
                affinity_extra, trace_s, seed, as_json)
        return
    if keda_rates:
        _keda(model, keda_rates, lanes_file, _max_running(max_running_specs), engine_slots,
              target_specs, token_scale, trace_s, seed, as_json)
        return
    try:
        table = load_lanes(lanes_file)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        classes: list[ClassLoad] = [parse_class(s) for s in class_specs]
        if workload_file:
            classes += load_classes(workload_file, table, rate)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if not classes:
        raise click.UsageError("give the workload: --class ... (repeat) or --workload FILE")
    classes = [c.scaled(scale) for c in classes]
    fair = _weights(weight_specs, classes) if by_key else None
    if weight_specs and not by_key:
        raise click.UsageError("--weight needs --by-key")
    targets = Targets(dict(_target(t) for t in target_specs), max_queue_s)
    lanes, groups = topology(table, topology_name)
    if split:
        counts = [int(x) for x in split.split(",")]
        if len(counts) != len(groups) or min(counts) < 1:
            raise click.BadParameter(f"{len(groups)} counts >= 1 wanted", param_hint="--split")
        needed = None
    else:
        found = [least_engines(classes, lanes, g, model, targets, duration_s=duration, seed=seed,
                               fair=fair)
                 for g in groups]
        if None in found:
            raise click.ClickException("no engine count meets the targets (a target below what "
                                       "one request alone takes?)")
        needed = [n for n in found if n is not None]
        counts = split_fleet(needed, engines) if engines else needed
    try:
        result = evaluate(classes, lanes, [replace(g, count=n) for g, n in zip(groups, counts)],
                          model, targets, duration_s=duration, seed=seed, fair=fair)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        click.echo(json.dumps(_to_dict(result, needed, engines), indent=2))
    else:
        click.echo(_render(result, needed, engines, targets))


def _weights(specs: tuple[str, ...], classes: list[ClassLoad]) -> dict[str, float]:
    """--weight CLASS=W, each naming a class (an API key's traffic), W > 0."""
    names = {c.name for c in classes}
    out: dict[str, float] = {}
    for text in specs:
        name, _, value = text.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = 0.0
        if name not in names or not weight > 0:
            raise click.BadParameter(f"{text!r}: CLASS=W with a --class name and W > 0",
                                     param_hint="--weight")
        out[name] = weight
    return out


def _max_running(specs: tuple[str, ...], option: str = "--max-running") -> dict[str, list[int]]:
    """--max-running (or `option`) LANE=N[,N...], each N >= 1."""
    out: dict[str, list[int]] = {}
    for text in specs:
        lane, _, values = text.partition("=")
        try:
            out[lane] = [int(v) for v in values.split(",")]
        except ValueError:
            out[lane] = []
        if not lane or not out[lane] or min(out[lane]) < 1:
            raise click.BadParameter(f"{text!r}: LANE=N[,N...], each N >= 1",
                                     param_hint=option)
    return out


def _compare(model: StepModel, gpus_text: str, lanes_file: Path | None, per_gpu_text: str,
             max_running: dict[str, list[int]], max_ahead: dict[str, list[int]],
             slots: int | None, token_scale: float, duration: float, seed: int,
             as_json: bool) -> None:
    """`--compare-fleet GPUS`: tailguard/plan/compare.py's rows for each fleet size and load."""
    from tailguard.plan import azure
    from tailguard.plan.compare import Point, compare, limit_sweep, render

    sweep = limit_sweep(max_running)
    try:
        sizes = [int(n) for n in gpus_text.split(",")]
        loads = [float(x) for x in per_gpu_text.split(",")]
        table = load_lanes(lanes_file or default_lanes_path())
        points = [Point(n, load, *compare(azure.arrivals(list(table), rate=load * n,
                                                         duration_s=duration,
                                                         token_scale=token_scale),
                                          table, model, n, sweep=sweep, slots=slots,
                                          ahead_sweep=limit_sweep(max_ahead), seed=seed))
                  for n in sizes for load in loads]
    except (ValueError, ConfigError) as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"points": [{"gpus": p.gpus, "per_gpu": p.per_gpu,
                                           "unloaded_short_p99_s": p.unloaded_p99_s,
                                           "rows": [r.to_dict() for r in p.rows]}
                                          for p in points]}, indent=2))
    else:
        click.echo(f"the Azure trace (azure-mix from {azure.START_S:g} s) for {duration:g} s, "
                   f"tokens x {token_scale:g}; simulated")
        click.echo(render(points))


def _prefix(model: StepModel, gpus_text: str, lanes_file: Path | None, per_gpu_text: str,
            kv_tokens: int, extra: int, duration: float, seed: int,
            as_json: bool) -> None:
    """`--prefix-cache GPUS`: tailguard/plan/prefix.py's rows."""
    from tailguard.plan.prefix import compare, render

    try:
        rows = compare(load_lanes(lanes_file or default_lanes_path()), model,
                       [int(n) for n in gpus_text.split(",")],
                       [float(x) for x in per_gpu_text.split(",")], duration_s=duration,
                       kv_tokens=kv_tokens, affinity=Affinity(extra), seed=seed)
    except (ValueError, ConfigError) as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"rows": [r.to_dict() for r in rows]}, indent=2))
    else:
        click.echo(f"chat and shared-doc for {duration:g} s, {kv_tokens} tokens of prefix cache "
                   f"per engine, affinity within {extra} requests of the least loaded engine; "
                   "simulated")
        click.echo(render(rows))


def _keda(model: StepModel, rates_text: str, lanes_file: Path | None,
          max_running: dict[str, list[int]], slots: int | None, target_specs: tuple[str, ...],
          token_scale: float, duration: float, seed: int, as_json: bool) -> None:
    """`--keda RATES`: tailguard/plan/keda.py's engines per load and the scaling threshold."""
    from tailguard.plan import azure, keda

    targets = dict(_target(t) for t in target_specs)
    target_s = targets.pop("short", 4.0)
    if targets or any(len(v) > 1 for v in max_running.values()):
        raise click.UsageError("--keda takes --target short:SECONDS only, and one --max-running "
                               "value per lane")
    limits = {lane: values[0] for lane, values in max_running.items()}
    try:
        rates = [float(x) for x in rates_text.split(",")]
        table = load_lanes(lanes_file or default_lanes_path())
        loads = keda.size(lambda rate: azure.arrivals(list(table), rate=rate, duration_s=duration,
                                                      token_scale=token_scale),
                          rates, table, model, target_s, limits=limits, slots=slots, seed=seed)
    except (ValueError, ConfigError) as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        t, held = keda.threshold(loads)
        needed = [l.engines for l in loads if l.engines]
        click.echo(json.dumps({"loads": [l.to_dict() for l in loads], "threshold": t,
                               "holds_at": held, "query": keda.query(table),
                               "min_replicas": min(needed, default=None),
                               "max_replicas": max(needed, default=None)}, indent=2))
    else:
        click.echo(f"the Azure trace (azure-mix from {azure.START_S:g} s) for {duration:g} s, "
                   f"tokens x {token_scale:g}; fleet setup, short P99 <= {target_s:g} s; "
                   "simulated")
        click.echo(keda.render(loads, table, target_s))


def _profile(profile_out: Path, cores: str | None, neighbour_cores: str | None,
             frontend_cores: str) -> None:
    """`--profile FILE`: the step model measured on a real engine, saved to FILE."""
    from tailguard.host.cores import Pinning
    from tailguard.host.cores import frontend_cores as front_of
    from tailguard.model.served import bench_model
    from tailguard.plan.profile import run_profile

    pins = [Pinning(cores=c) for c in (_cores(cores), _cores(neighbour_cores)) if c]
    try:
        front = front_of(pins, frontend_cores)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--frontend-cores") from None
    model = run_profile(bench_model(), say=click.echo, cores=_cores(cores),
                        neighbour_cores=_cores(neighbour_cores), frontend_cores=front)
    model.save(profile_out)
    click.echo(f"step model: step_s = {model.a_s * 1e3:.3f} ms + {model.decode_s * 1e3:.4f} ms "
               f"x decoding seqs + {model.prefill_s * 1e3:.5f} ms x prefill tokens + "
               f"{model.context_s * 1e6:.3f} us x context tokens; beside a busy neighbour "
               f"+{100 * model.neighbour_slowdown:.0f}% -> {profile_out}")


def _fit_frontend(model: StepModel, path: Path, report_path: Path) -> None:
    from tailguard.plan.stepmodel import fit_frontend, frontend_points, path_free

    points = frontend_points(json.loads(report_path.read_text()))
    try:
        per_request, per_token = fit_frontend([p for _, p in points])
    except ValueError as exc:
        raise click.ClickException(f"{report_path}: {exc} (a run of tailguard bench that "
                                   "records its front end's CPU, with two or more phases)") from None
    for name, (n, tokens, cpu) in points:
        click.echo(f"{name:<18} {n:>5} requests {tokens:>7} tokens: front end {cpu:6.1f} CPU s, "
                   f"fit {per_request * n + per_token * tokens:6.1f}")
    model = replace(model, frontend_s_per_request=per_request, frontend_s_per_token=per_token,
                    source={**model.source, "frontend_from": path_free(report_path, 2),
                            "frontend_points": {k: list(v) for k, v in points}})
    model.save(path)
    click.echo(f"front end: {per_request * 1e3:.2f} ms CPU per request + {per_token * 1e3:.3f} ms "
               f"per output token -> {path}")


def _to_dict(p: Plan, needed: list[int] | None, fleet: int | None) -> dict:
    return {"groups": [{"lanes": list(g.lanes), "engines": g.count} for g in p.groups],
            "least_engines": needed, "fleet": fleet, "met": p.met,
            "classes": {n: r.to_dict() for n, r in p.results.items()}}


def _render(p: Plan, needed: list[int] | None, fleet: int | None, targets: Targets) -> str:
    out = []
    if needed is not None:
        each = ", ".join(f"{_name(g)} {n}" for g, n in zip(p.groups, needed))
        out.append(f"least engines meeting the targets: {sum(needed)} ({each})")
        if fleet is not None and fleet < sum(needed):
            out.append(f"a fleet of {fleet} is too small: shown is the least that meets them")
    out.append("split: " + ", ".join(f"{_name(g)} {g.count}" for g in p.groups)
               + f" = {p.engines} engines; targets {'met' if p.met else 'NOT met'}")
    out.append("")
    out.append(f"{'class':<10}{'lanes':<16}{'n':>7} {'P50 s':>8} {'P99 s':>8} {'TTFT P99':>9} "
               f"{'queue P99':>10} {'tok/s':>9}  target / not succeeded")
    for name, r in p.results.items():
        bad = {k: v for k, v in r.statuses.items() if k != "succeeded"}
        goal = targets.p99_s.get(name)
        out.append(f"{name:<10}{','.join(r.lanes):<16}{r.n:>7} {_s(r.e2e['p50'])} {_s(r.e2e['p99'])} "
                   f" {_s(r.ttft_p99)} {_s(r.queued_p99):>10} {r.tokens_per_s:>9.1f}  "
                   f"{f'P99 <= {goal:g} s' if goal else f'queue P99 <= {targets.max_queue_s:g} s'}"
                   f"{' ' + str(bad) if bad else ''}")
    return "\n".join(out)


def _name(g: EngineGroup) -> str:
    return "+".join(g.lanes)


def _s(x: float | None) -> str:
    return f"{x:8.3f}" if x is not None else "       -"
