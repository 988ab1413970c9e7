"""The `tailguard` command: run the system, or one piece of it.

    tailguard up                       everything: Redis, API, one worker per lane group, Flower
    tailguard worker --lane long [--gpu 1 | --cores 2,3]
    tailguard api | flower | redis     one process each (what the Procfile runs)
    tailguard keys add|list|revoke     API keys (authentication is on once one exists)
    tailguard make-demo-model DIR [--size tiny|small]
    tailguard plan --step-model FILE --class short:2:3:64 ...   engines per lane, by simulation
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from tailguard import settings
from tailguard.bench.report import render_text
from tailguard.bench.run import BenchConfig, run_bench
from tailguard.bench.topology import TopologyError
from tailguard.errors import ConfigError
from tailguard.host.procs import become, console_script
from tailguard.plan.command import plan


@click.group()
def main() -> None:
    """tailguard: keep short requests' tail latency low while long ones share the fleet."""


@main.command("make-demo-model")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--size", type=click.Choice(["tiny", "small"]), default="tiny", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def make_demo_model(out_dir: Path, size: str, seed: int) -> None:
    """Build a random-weight Llama and a locally trained tokenizer in OUT_DIR (offline)."""
    from tailguard.model.demo import build_demo_model

    path = build_demo_model(out_dir, size=size, seed=seed)
    click.echo(f"demo model ({size}) in {path}: random weights, its text is noise")


@main.command()
@click.option("--lane", "lane", help="serve the configured worker whose first lane is LANE")
@click.option("--worker", "worker_name", help="serve the [[workers]] entry with this name")
@click.option("--gpu", type=int, help="pin to this GPU (sets CUDA_VISIBLE_DEVICES)")
@click.option("--cores", help="pin to these CPU cores, e.g. 0,1 (CPU-only hosts)")
@click.option("--concurrency", "-c", type=int, help="threads; default: the lanes' max_num_seqs")
@click.option("--metrics-port", type=int, help="serve Prometheus metrics here (default: "
              f"${settings.WORKER_METRICS_PORT.env}, 0 = off)")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
def worker(lane: str | None, worker_name: str | None, gpu: int | None, cores: str | None,
           concurrency: int | None, metrics_port: int | None, loglevel: str) -> None:
    """Run one Celery worker hosting one vLLM engine for one lane group."""
    from tailguard.host.cores import Pinning
    from tailguard.jobs.liveness import node_name
    from tailguard.lanes.table import engine_settings_for, load_lanes
    from tailguard.model.served import DEMO_NOTICE, served_model

    table = load_lanes()
    if bool(lane) == bool(worker_name):
        raise click.UsageError("give exactly one of --lane or --worker")
    spec = table.worker(worker_name) if worker_name else table.worker_for_lane(lane)
    lanes = table.lanes_for_queues(spec.lanes)
    model, is_demo = served_model()
    if is_demo:
        click.echo(f"[{spec.name}] {DEMO_NOTICE}", err=True)
    env = {settings.MODEL.env: model}
    if metrics_port is not None:
        env[settings.WORKER_METRICS_PORT.env] = str(metrics_port)
    become([console_script("celery"), "-A", "tasks", "worker", "-Q", ",".join(spec.lanes),
            "-n", node_name(spec.name), "-c", str(concurrency or engine_settings_for(lanes)[0]),
            "-l", loglevel], env=env, pin=Pinning.from_options(gpu, cores))


@main.command()
@click.option("--port", type=int,
              help=f"default: ${settings.API_PORT.env} or {settings.API_PORT.default}")
@click.option("--bind", "host", default="127.0.0.1", show_default=True)
def api(port: int | None, host: str) -> None:
    """Serve the REST API with gunicorn (threads, so long-polls do not block each other).

    With no API key in Redis it serves loopback only: binding elsewhere refuses to start
    (unless $TAILGUARD_API_OPEN)."""
    from tailguard.gateway.api_keys import check_bind
    from tailguard.model.served import served_model

    try:
        have_keys = _key_store().any()
    except ConfigError:
        have_keys = False  # Redis not up yet: as if no key existed (the stricter case)
    try:
        mode = check_bind(host, have_keys=have_keys, open_api=settings.API_OPEN.get())
        click.echo(f"tailguard api: {mode}", err=True)
    except ConfigError as exc:
        raise click.ClickException(exc.message) from None
    model, _ = served_model()
    become([console_script("gunicorn"), "--bind", f"{host}:{port or settings.API_PORT.get()}",
            "--worker-class", "gthread", "--threads", str(settings.API_THREADS.get()),
            # connections past this wait unaccepted: room for every thread, plus idle keep-alives
            "--worker-connections", str(2 * settings.API_THREADS.get()),
            "--workers", "1", "--timeout", "120", "--access-logfile", "-",
            "--config", "python:app.gunicorn_hooks", "app:create_app()"],
           env={settings.MODEL.env: model})


def _key_store():
    """The API keys of the configured Redis (ConfigError when it does not answer)."""
    import redis as redis_lib

    from tailguard.gateway.api_keys import ApiKeyStore
    from tailguard.redis.client import connect

    client = connect(settings.redis_url(), socket_connect_timeout=3)
    try:
        client.ping()
    except redis_lib.RedisError as exc:
        raise ConfigError(f"Redis at {settings.redis_url()} does not answer: {exc}",
                          field=settings.REDIS_URL.env) from None
    return ApiKeyStore(client)


@main.group()
def keys() -> None:
    """API keys, kept hashed in Redis. Once one exists every /v1/ call needs one
    (Authorization: Bearer <key>); with none, the API serves loopback only."""


@keys.command("add")
@click.argument("name")
@click.option("--rpm", type=int, help="requests per minute (default: no limit)")
@click.option("--tpm", type=int, help="cost tokens (prompt + max_tokens) per minute (default: no limit)")
@click.option("--max-priority", type=click.Choice(["interactive", "batch"]), default="interactive",
              show_default=True, help="highest class: a batch key's requests all run as batch")
def keys_add(name: str, rpm: int | None, tpm: int | None, max_priority: str) -> None:
    """Make a key named NAME and print it (the only time it is shown)."""
    from tailguard.gateway.api_keys import ApiKey

    try:
        secret = _key_store().add(ApiKey(name, requests_per_min=rpm, tokens_per_min=tpm,
                                         max_priority=max_priority))
    except ConfigError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(secret)
    click.echo(f"key {name!r} made; it is shown only now (Redis keeps its sha256). "
               "Send it as: Authorization: Bearer <key>", err=True)


@keys.command("list")
def keys_list() -> None:
    """Names and limits of the keys (never the keys themselves)."""
    try:
        found = _key_store().list()
    except ConfigError as exc:
        raise click.ClickException(exc.message) from None
    if not found:
        click.echo("no API keys: authentication is off (the API serves loopback only)")
    for k in found:
        click.echo(f"{k.name:<24} sha256 {k.id[:12]}  rpm {k.requests_per_min or '-'}  "
                   f"tpm {k.tokens_per_min or '-'}  max priority {k.max_priority}")


@keys.command("revoke")
@click.argument("name")
def keys_revoke(name: str) -> None:
    """Delete the key named NAME: its next request is a 401."""
    try:
        gone = _key_store().revoke(name)
    except ConfigError as exc:
        raise click.ClickException(exc.message) from None
    if not gone:
        raise click.ClickException(f"no key named {name!r}")
    click.echo(f"key {name!r} revoked")


@main.command()
@click.option("--port", type=int,
              help=f"default: ${settings.FLOWER_PORT.env} or {settings.FLOWER_PORT.default}")
def flower(port: int | None) -> None:
    """Run Flower on the lane queues, always behind basic auth: $TAILGUARD_FLOWER_BASIC_AUTH,
    else a password generated once into $TAILGUARD_HOME/flower.auth."""
    argv = [console_script("celery"), "-A", "tasks", "flower",
            f"--port={port or settings.FLOWER_PORT.get()}", "--address=127.0.0.1"]
    from tailguard.launch.supervisor import flower_auth

    home = settings.home()
    home.mkdir(parents=True, exist_ok=True)
    # Flower reads its options from FLOWER_<NAME> variables: the password stays off argv.
    become(argv, env={"FLOWER_BASIC_AUTH": flower_auth(home)})


@main.command()
@click.option("--port", type=int,
              help=f"default: ${settings.REDIS_PORT.env} or {settings.REDIS_PORT.default}")
def redis(port: int | None) -> None:
    """Run the embedded redis-server in the foreground (data and AOF under $TAILGUARD_HOME), with
    the password kept in $TAILGUARD_HOME/redis.password (made on first use)."""
    from tailguard.host.redis_server import redis_command
    from tailguard.host.secrets import embedded_redis_password

    become(redis_command(port or settings.REDIS_PORT.get(), settings.home() / "redis",
                         password=embedded_redis_password()))


@main.command()
@click.option("--window", default="15m", show_default=True, help="how far back: 90s, 15m, 2h, 1d")
@click.option("--top", default=10, show_default=True, help="how many slowest requests to list")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def stats(window: str, top: int, as_json: bool) -> None:
    """Per-lane latency and length distributions, and the slowest requests, from Redis."""
    import json

    import redis as redis_lib

    from tailguard.jobs.liveness import Liveness
    from tailguard.lanes.table import load_lanes
    from tailguard.observe.stats import StatsStore, parse_window
    from tailguard.redis.client import connect

    try:
        seconds = parse_window(window)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--window") from None
    client = connect(settings.redis_url(), socket_connect_timeout=3)
    try:
        now_s, now_us = client.time()
    except redis_lib.RedisError as exc:
        raise click.ClickException(f"Redis at {settings.redis_url()} does not answer: {exc}") from None
    now = now_s + now_us / 1e6
    names = load_lanes().names
    result = StatsStore(client).window(names, now - seconds, now, top=top)
    per_host = Liveness(client).live_workers_per_host(names)  # now, not over the window
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "workers_per_host": per_host}, indent=2))
    else:
        click.echo(result.render() + "\n\nlive workers now, per host: " + "; ".join(
            f"{lane} " + (", ".join(f"{host} {n}" for host, n in hosts.items()) or "none")
            for lane, hosts in per_host.items()))


@main.command()
def up() -> None:
    """Start the whole system and stop all of it on Ctrl-C."""
    from tailguard.launch.supervisor import run_up

    sys.exit(run_up())


def _bench_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """One option per BenchConfig field that declares one: name, default and help come from the
    field (tailguard/bench/run.py), so none is written twice."""
    hints = typing.get_type_hints(BenchConfig)
    for f in reversed(dataclasses.fields(BenchConfig)):
        opt = f.metadata.get("option")
        if opt is None:
            continue
        flag = opt.flag or "--" + f.name.replace("_", "-")
        kind = next(t for t in (typing.get_args(hints[f.name]) or (hints[f.name],))
                    if t is not type(None))
        how: dict[str, Any] = {"help": opt.help, "show_default": True, "default": f.default}
        if kind is bool:
            flag = f"{flag}/--no-{flag[2:]}"
        elif opt.parse:
            how.update(type=click.Choice(opt.choices) if opt.choices else str,
                       default=None if f.default is None else opt.text(f.default),
                       callback=_parsed_by(opt.parse))
        elif kind is Path:  # *_file must not be a folder, *_dir must not be a file
            how["type"] = click.Path(path_type=Path, dir_okay=not f.name.endswith("_file"),
                                     file_okay=not f.name.endswith("_dir"))
        else:
            how["type"] = kind
        command = click.option(flag, f.name, **how)(command)
    return command


def _parsed_by(parse: Callable[[str], Any]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        try:
            return None if value is None else parse(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return callback


@main.command()
@_bench_options
@click.option("--check", is_flag=True, help="exit 1 when a target line says FAIL")
def bench(check: bool, **config: Any) -> None:
    """Benchmark short-request tail latency: shared queue vs lanes vs plain vLLM, real engines."""
    cfg = BenchConfig(**config)
    try:
        report = run_bench(cfg)
    except (ValueError, TopologyError, ConfigError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(render_text(report))
    for kind, path in report["files"].items():
        click.echo(f"{kind:8} {path}")
    if check and any(t["status"] == "FAIL" for t in report["targets"]):
        sys.exit(1)


main.add_command(plan)

if __name__ == "__main__":
    main()
