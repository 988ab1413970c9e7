"""The `tailguard` command: run the system, or one piece of it.

    tailguard up                       everything: Redis, API, one worker per lane group, Flower
    tailguard worker --lane long [--gpu 0,1 | --cores 2,3]
    tailguard api | flower | redis     one process each (what the Procfile runs)
    tailguard keys add|edit|list|revoke API keys (required unless TAILGUARD_API_AUTH=open)
    tailguard make-demo-model DIR [--size tiny|small]
    tailguard plan --step-model FILE --class short:2:3:64 ...   engines per lane, by simulation
    tailguard bench [--workload mixed|overload|...]   tail latency: shared vs lanes vs plain vLLM
    tailguard conformance --out DIR    the same OpenAI requests against vllm serve and tailguard
"""

from __future__ import annotations

import dataclasses
import os
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
from tailguard.conformance.run import COMPAT, ConformanceConfig, run_conformance
from tailguard.errors import ConfigError, TailguardError
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
@click.option("--worker", "worker_name", help="serve the [[workers]] entry with this name, or "
              "one of its replicas (long-2 is the second of long)")
@click.option("--gpu", help="pin to these GPUs, e.g. 1 or 0,1 (sets CUDA_VISIBLE_DEVICES)")
@click.option("--cores", help="pin to these CPU cores, e.g. 0,1 (CPU-only hosts)")
@click.option("--concurrency", "-c", type=int, help="threads; default: the lanes' max_num_seqs")
@click.option("--metrics-port", type=int, help="serve Prometheus metrics here (default: "
              f"${settings.WORKER_METRICS_PORT.env}, else off; 0 = off)")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
def worker(lane: str | None, worker_name: str | None, gpu: str | None, cores: str | None,
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
    env = {settings.MODEL.env: model, settings.WORKER.env: spec.name}
    if metrics_port is not None:
        env[settings.WORKER_METRICS_PORT.env] = str(metrics_port)
    become([console_script("celery"), "-A", "tasks", "worker", "-Q", ",".join(spec.lanes),
            "-n", node_name(worker_name or spec.name),
            "-c", str(concurrency or engine_settings_for(lanes)[0]),
            "-l", loglevel], env=env, pin=Pinning.from_options(gpu, cores))


@main.command()
@click.option("--port", type=int,
              help=f"default: ${settings.API_PORT.env} or {settings.API_PORT.default}")
@click.option("--host", help=f"address (default: ${settings.HOST.env} or {settings.HOST.default})")
@click.option("--bind", "old_bind", hidden=True, help="the old name of --host")
def api(port: int | None, host: str | None, old_bind: str | None) -> None:
    """Serve the REST API with gunicorn (threads, so long-polls do not block each other).

    $TAILGUARD_API_AUTH says whether it needs API keys; unset, it does on any bind but
    loopback. Open mode on a non-loopback bind refuses to start (unless $TAILGUARD_API_OPEN)."""
    from tailguard.gateway.api_keys import resolve_auth
    from tailguard.model.served import prepare_served_model

    host = host or _renamed(old_bind, "--bind", "--host") or settings.HOST.get()
    try:
        mode, says = resolve_auth(host, settings.API_AUTH.get(), open_remote=settings.API_OPEN.get())
    except ConfigError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"tailguard api: auth mode {mode}: {says}", err=True)
    try:
        made = len(_key_store().list())
    except ConfigError:
        made = None  # Redis not up yet: nothing to say about keys
    if mode == settings.AUTH_OPEN and made:
        click.echo(f"tailguard api: {made} API key(s) exist but are not asked for: set "
                   f"{settings.API_AUTH.env}=keys to require them", err=True)
    elif mode == settings.AUTH_KEYS and made == 0:
        click.echo("tailguard api: no API key exists yet, so every /v1/ call is a 401 until "
                   "`tailguard keys add NAME` makes one", err=True)
    try:
        served = prepare_served_model()
    except ConfigError as exc:
        raise click.ClickException(exc.message) from None
    become([console_script("gunicorn"), "--bind", f"{host}:{port or settings.API_PORT.get()}",
            "--worker-class", "gthread", "--threads", str(settings.API_THREADS.get()),
            # connections past this wait unaccepted: room for every thread, plus idle keep-alives
            "--worker-connections", str(2 * settings.API_THREADS.get()),
            "--workers", "1", "--timeout", "120", "--access-logfile", "-",
            "--keep-alive", str(settings.API_KEEPALIVE_S.get()),
            "--config", "python:app.gunicorn_hooks", "app:create_app()"],
           env={**served.env(), settings.API_AUTH.env: mode})


def _renamed(value: str | None, old: str, new: str) -> str | None:
    """An old option's value, with a note: `--bind` (api) and `--address` (flower) are now
    `--host`, as `tailguard up` names the same address; the old names go in the next release."""
    if value is not None:
        click.echo(f"tailguard: {old} is now {new}; {old} goes in the next release", err=True)
    return value


def _redis_client():
    """A client of the configured Redis, once it answers (ConfigError when it does not)."""
    import redis as redis_lib

    from tailguard.redis.client import connect

    url = settings.redis_url()
    try:
        client = connect(url, socket_connect_timeout=3, socket_timeout=3)
        client.ping()
    except (redis_lib.RedisError, ValueError) as exc:
        raise ConfigError(f"Redis at {settings.redact_url(url)} does not answer: "
                          f"{_redacted_error(exc, url)}", field=settings.REDIS_URL.env) from None
    return client


def _key_store():
    """The API keys of the configured Redis (ConfigError when it does not answer)."""
    from tailguard.gateway.api_keys import ApiKeyStore

    return ApiKeyStore(_redis_client())


def _redacted_error(exc: Exception, url: str) -> str:
    """An error's text without the URL's password, should the library have echoed it."""
    from urllib.parse import unquote, urlsplit

    text = str(exc)
    for part in url.split(";"):
        try:
            password = urlsplit(part).password
        except ValueError:
            continue
        for secret in {password, unquote(password or "")} - {None, ""}:
            text = text.replace(secret, "***")
    return text


@main.group()
def keys() -> None:
    """API keys, kept hashed in Redis. In keys mode (TAILGUARD_API_AUTH; the default on any
    bind but loopback) every /v1/ call needs one: Authorization: Bearer <key>."""


def _key_share_options(fn: Any) -> Any:
    """The options `keys add` and `keys edit` share: the key's weight and its bounds."""
    bounds = [("--min-ttft-ms", "tightest time-to-first-token target its requests may ask for "
               "(a tighter one is raised to it)"),
              ("--max-ttft-ms", "loosest time-to-first-token target (a looser one is lowered)"),
              ("--min-tpot-ms", "tightest time-per-output-token target"),
              ("--max-tpot-ms", "loosest time-per-output-token target"),
              ("--min-vllm-priority", "most urgent vLLM `priority` (lower is sooner) it may send")]
    for flag, text in reversed(bounds):
        fn = click.option(flag, type=int, help=text + (" [edit: 0 clears]" if "ms" in flag
                                                        else ""))(fn)
    return click.option("--weight", type=float,
                        help="its share of a contended lane against other keys' [default: 1]")(fn)


_BOUND_FIELDS = ("min_ttft_ms", "max_ttft_ms", "min_tpot_ms", "max_tpot_ms", "min_vllm_priority")


@keys.command("add")
@click.argument("name")
@click.option("--rpm", type=int, help="requests per minute (default: no limit)")
@click.option("--tpm", type=int, help="cost tokens (prompt + max_tokens) per minute (default: no limit)")
@click.option("--max-priority", type=click.Choice(["interactive", "batch"]), default="interactive",
              show_default=True, help="highest class: a batch key's requests all run as batch")
@click.option("--admin", is_flag=True, help="sees and cancels every key's jobs (others: their own)")
@_key_share_options
def keys_add(name: str, rpm: int | None, tpm: int | None, max_priority: str, admin: bool,
             weight: float | None, **bounds: int | None) -> None:
    """Make a key named NAME and print it (the only time it is shown)."""
    from tailguard.gateway.api_keys import ApiKey

    try:
        store = _key_store()
        secret = store.add(ApiKey(name, requests_per_min=rpm, tokens_per_min=tpm,
                                  max_priority=max_priority, admin=admin,
                                  weight=1.0 if weight is None else weight, **bounds))
    except ConfigError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(secret)  # stdout holds the key alone: scripts read it
    click.echo(f"key {name!r} made; it is shown only now (Redis keeps its sha256). "
               "Send it as: Authorization: Bearer <key>", err=True)
    note = _unasked_key_note(store.served_mode())
    if note:
        click.echo(note, err=True)


@keys.command("edit")
@click.argument("name")
@click.option("--rpm", type=int, help="requests per minute (0: no limit)")
@click.option("--tpm", type=int, help="cost tokens per minute (0: no limit)")
@click.option("--max-priority", type=click.Choice(["interactive", "batch"]))
@_key_share_options
def keys_edit(name: str, rpm: int | None, tpm: int | None, max_priority: str | None,
              weight: float | None, **bounds: int | None) -> None:
    """Change the key named NAME in place (its secret stays the same): only what is given."""
    changes: dict[str, Any] = {"requests_per_min": rpm, "tokens_per_min": tpm,
                               "max_priority": max_priority, "weight": weight, **bounds}
    # 0 clears a limit or a latency bound (neither may be 0); vLLM's priority may well be 0
    clearable = {"requests_per_min", "tokens_per_min", *_BOUND_FIELDS[:4]}
    changes = {k: None if v == 0 and k in clearable else v
               for k, v in changes.items() if v is not None}
    if not changes:
        raise click.ClickException("nothing to change: give --weight, --rpm, --tpm, "
                                   "--max-priority or a bound")
    try:
        edited = _key_store().edit(name, **changes)
    except ConfigError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(_key_line(edited))


def _unasked_key_note(mode: str | None) -> str | None:
    """What `keys add` says when the new key may be asked for by nothing: the API that started
    last on this Redis serves open mode (`mode`, as it recorded it), or no API has started."""
    auth = settings.API_AUTH.env
    if mode == settings.AUTH_OPEN:
        return (f"warning: the API runs in open mode ({auth}=open, or unset on a loopback bind): it "
                "asks no caller for a key, so this key is not checked and any caller can read "
                f"and cancel any job. To require keys, set {auth}=keys and restart the API "
                "(`tailguard up`, or `tailguard api`).")
    if mode is None:
        return (f"note: no API has started on this Redis yet. Keys are asked for only when the API "
                f"runs with {auth}=keys; unset, it is open on a loopback bind (as `tailguard up` "
                "serves by default) and asks no caller for a key.")
    return None


@keys.command("list")
def keys_list() -> None:
    """Names and limits of the keys (never the keys themselves)."""
    try:
        found = _key_store().list()
    except ConfigError as exc:
        raise click.ClickException(exc.message) from None
    if not found:
        click.echo("no API keys: in keys mode every /v1/ call is refused until "
                   "`tailguard keys add NAME` makes one")
    for k in found:
        click.echo(_key_line(k))


def _key_line(k: Any) -> str:
    """One key as `keys list` shows it (never the key itself): limits, weight, bounds."""
    def span(lo: int | None, hi: int | None) -> str:
        return "-" if lo is None and hi is None else f"{lo or ''}..{hi or ''}"

    bounds = (f"  ttft ms {span(k.min_ttft_ms, k.max_ttft_ms)}  "
              f"tpot ms {span(k.min_tpot_ms, k.max_tpot_ms)}"
              if any(getattr(k, f) is not None for f in _BOUND_FIELDS[:4]) else "")
    if k.min_vllm_priority is not None:
        bounds += f"  vllm priority >= {k.min_vllm_priority}"
    return (f"{k.name:<24} sha256 {k.id[:12]}  rpm {k.requests_per_min or '-'}  "
            f"tpm {k.tokens_per_min or '-'}  max priority {k.max_priority}  weight {k.weight:g}"
            + bounds + ("  admin" if k.admin else ""))


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


@main.group()
def batches() -> None:
    """Batches of the OpenAI Batch API (/v1/batches), every key's, as Redis holds them."""


def _batch_service():
    """What the API's views ask, as an admin key sees it (every key's batches)."""
    from tailguard.batches.contents import Contents
    from tailguard.batches.service import BatchService
    from tailguard.batches.store import BatchStore

    location = settings.BATCH_STORAGE.get() or str(settings.home() / "batch-files")
    store = BatchStore(_redis_client(), Contents(location),
                       output_ttl_s=settings.BATCH_OUTPUT_TTL_S.get())
    return BatchService(store, settings.BATCH_MAX_FILE_BYTES.get())


@batches.command("list")
@click.option("--limit", type=click.IntRange(1, 100), default=20, show_default=True)
def batches_list(limit: int) -> None:
    """The latest batches, newest first: status, lines completed+failed/total, endpoint."""
    try:
        found = _batch_service().batches(None, None, str(limit))["data"]
    except TailguardError as exc:
        raise click.ClickException(exc.message) from None
    if not found:
        click.echo("no batches")
    for b in found:
        counts = b["request_counts"]
        click.echo(f"{b['id']}  {b['status']:<11} {counts['completed']}+{counts['failed']}"
                   f"/{counts['total']}  {b['endpoint']}")


@batches.command("show")
@click.argument("batch_id")
def batches_show(batch_id: str) -> None:
    """The batch as GET /v1/batches/BATCH_ID answers it (JSON)."""
    import json

    try:
        click.echo(json.dumps(_batch_service().batch(batch_id, None), indent=2))
    except TailguardError as exc:
        raise click.ClickException(exc.message) from None


@batches.command("cancel")
@click.argument("batch_id")
def batches_cancel(batch_id: str) -> None:
    """Stop queuing the batch's lines; it ends cancelled once its lines in flight finish."""
    try:
        batch = _batch_service().cancel(batch_id, None)
    except TailguardError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"batch {batch_id} {batch['status']}")


@main.command()
@click.option("--port", type=int,
              help=f"default: ${settings.FLOWER_PORT.env} or {settings.FLOWER_PORT.default}")
@click.option("--host", help=f"address (default: ${settings.HOST.env} or {settings.HOST.default})")
@click.option("--address", "old_address", hidden=True, help="the old name of --host")
def flower(port: int | None, host: str | None, old_address: str | None) -> None:
    """Run Flower on the lane queues, always behind basic auth: $TAILGUARD_FLOWER_BASIC_AUTH,
    else a password generated once into $TAILGUARD_HOME/flower.auth."""
    host = host or _renamed(old_address, "--address", "--host") or settings.HOST.get()
    argv = [console_script("celery"), "-A", "tasks", "flower",
            f"--port={port or settings.FLOWER_PORT.get()}", f"--address={host}"]
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
    import os

    from tailguard.host.redis_server import port_held, port_in_use, redis_command
    from tailguard.host.secrets import embedded_redis_password

    port = port or settings.REDIS_PORT.get()
    if port_in_use(port):  # redis-server would fail to bind; say why, and what to do, first
        raise click.ClickException(port_held(port, "127.0.0.1", what="redis-server",
                                             setting=settings.REDIS_PORT.env,
                                             option="--port").message)
    os.umask(0o077)  # its AOF holds every prompt and output: 0600, as the folders are 0700
    become(redis_command(port, settings.home() / "redis", password=embedded_redis_password()))


@main.command()
@click.option("--window", default="15m", show_default=True, help="how far back: 90s, 15m, 2h, 1d")
@click.option("--top", default=10, show_default=True, help="how many slowest requests to list")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--by", "by", type=click.Choice(["lane", "key"]), default="lane", show_default=True,
              help="key: per API key (keys mode): requests, latency, refusals by code, and its "
                   "share of each lane's output tokens")
def stats(window: str, top: int, as_json: bool, by: str) -> None:
    """Per-lane latency and length distributions, and the slowest requests, from Redis."""
    import json

    import redis as redis_lib

    from tailguard.batches.metrics import read_figures
    from tailguard.jobs.liveness import Liveness
    from tailguard.lanes.table import load_lanes
    from tailguard.observe.stats import StatsStore, parse_window, render_keys
    from tailguard.redis.client import connect

    try:
        seconds = parse_window(window)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--window") from None
    url = settings.redis_url()
    try:
        client = connect(url, socket_connect_timeout=3, socket_timeout=10)
        now_s, now_us = client.time()
    except (redis_lib.RedisError, ValueError, ConfigError) as exc:
        message = exc.message if isinstance(exc, ConfigError) else _redacted_error(exc, url)
        raise click.ClickException(f"Redis at {settings.redact_url(url)} does not answer: "
                                   f"{message}") from None
    now = now_s + now_us / 1e6
    names = load_lanes().names
    store = StatsStore(client)
    result = store.window(names, now - seconds, now, top=top)
    if by == "key":
        by_key = store.keys_window(now - seconds, now)
        if as_json:
            click.echo(json.dumps({"window": {"start": now - seconds, "end": now},
                                   "keys": {n: k.to_dict(result.lanes) for n, k in by_key.items()}},
                                  indent=2))
        else:
            click.echo(render_keys(by_key, result.lanes))
        return
    liveness = Liveness(client)
    per_host = liveness.live_workers_per_host(names)  # now, not over the window
    batches = read_figures(client)  # now, not over the window
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "workers_per_host": per_host,
                               "batches": batches.to_dict()}, indent=2))
    else:
        click.echo(result.render() + "\n\nlive workers now, per host: " + "; ".join(
            f"{lane} " + (", ".join(f"{host} {n}" for host, n in hosts.items()) or "none")
            for lane, hosts in per_host.items()) + "\n" + batches.render())


@main.command()
@click.option("--host", help=f"address of the API and Flower (default: ${settings.HOST.env} or "
              f"{settings.HOST.default}; the embedded Redis stays on loopback)")
@click.option("--port", type=int,
              help=f"API port (default: ${settings.API_PORT.env} or {settings.API_PORT.default})")
@click.option("--flower-port", type=int, help=f"default: ${settings.FLOWER_PORT.env} or "
              f"{settings.FLOWER_PORT.default}")
@click.option("--redis-port", type=int, help=f"the embedded Redis's (default: "
              f"${settings.REDIS_PORT.env} or {settings.REDIS_PORT.default})")
@click.option("--lanes", "lanes_file", type=click.Path(dir_okay=False, exists=True),
              help=f"the lanes file (default: ${settings.LANES_FILE.env}, else the packaged one "
              "sized for this host: lanes-cpu.toml without a GPU, lanes.toml with one)")
def up(host: str | None, port: int | None, flower_port: int | None,
       redis_port: int | None, lanes_file: str | None) -> None:
    """Start the whole system and stop all of it on Ctrl-C.

    The model is resolved and every port checked before anything starts: a model that
    cannot be had, or a port another server holds, is one error."""
    from tailguard.gateway.api_keys import resolve_auth
    from tailguard.launch.supervisor import Binds, run_up

    if lanes_file:  # as if given by the environment: every process `up` starts reads it
        os.environ[settings.LANES_FILE.env] = str(Path(lanes_file).resolve())
    try:
        binds = Binds.from_settings(host=host, port=port, flower_port=flower_port,
                                    redis_port=redis_port)
        # what `tailguard api` would refuse on this bind, refused before anything starts
        resolve_auth(binds.host, settings.API_AUTH.get(), open_remote=settings.API_OPEN.get())
        code = run_up(binds)
    except ConfigError as exc:
        raise click.ClickException(exc.message) from None
    sys.exit(code)


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
    if cfg.workload == COMPAT:  # the old spelling of `tailguard conformance`, for one release
        click.echo("tailguard bench: --workload compat is deprecated and will be removed in the "
                   "next release: run `tailguard conformance` (same checks, same report)", err=True)
        _conformance(ConformanceConfig(
            model=cfg.model, checks=cfg.compat_checks, cores=cfg.cores, lanes_file=cfg.lanes_file,
            out_dir=cfg.out_dir, progress=cfg.progress, start_timeout_s=cfg.start_timeout_s), check)
        return
    _run_tool(run_bench, cfg, render_text, check)


def _run_tool(run: Callable[[Any], dict[str, Any]], cfg: Any,
              render: Callable[[dict[str, Any]], str], check: bool) -> None:
    """Run a tool (bench, conformance) on `cfg`: its text report, then its files and verdict."""
    try:
        report = run(cfg)
    except (ValueError, TopologyError, ConfigError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(render(report))
    _files_and_verdict(report, check)


def _files_and_verdict(report: dict[str, Any], check: bool) -> None:
    """A tool's report files, one a line; with --check, exit 1 on a FAIL line."""
    for kind, path in report["files"].items():
        click.echo(f"{kind:8} {path}")
    if check and any(t["status"] == "FAIL" for t in report["targets"]):
        sys.exit(1)


def _conformance(cfg: ConformanceConfig, check: bool) -> None:
    from tailguard.conformance.compare import render_text as render_conformance

    _run_tool(run_conformance, cfg, render_conformance, check)


def _comma_list(parse: Callable[[str], Any]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    return _parsed_by(lambda text: tuple(parse(t.strip()) for t in text.split(",") if t.strip()))


@main.command()
@click.option("--model", help="default: what `tailguard up` serves ($TAILGUARD_MODEL, else the "
              "bundled SmolLM2-135M-Instruct)")
@click.option("--checks", callback=_comma_list(str),
              help="only these checks, comma-separated (default: all)")
@click.option("--cores", callback=_comma_list(int),
              help="CPU cores both servers run on, e.g. 0,1 (default: all)")
@click.option("--lanes", "lanes_file", type=click.Path(path_type=Path, dir_okay=False),
              help=f"tailguard's lanes file (default: ${settings.LANES_FILE.env} or the shipped one)")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False),
              help="where report.json, report.md, answers.jsonl and logs go "
                   f"(default: ${settings.HOME.env}/conformance/<time>)")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="log each check's result as it comes")
@click.option("--check", is_flag=True, help="exit 1 when a target line says FAIL")
def conformance(check: bool, **config: Any) -> None:
    """The same OpenAI requests, sent with the openai SDK, against `vllm serve` and then
    tailguard's lanes on the same model and cores: tailguard passes what vLLM passes but its
    documented refusals, fails no job after queueing, and gives the SDK nothing to retry."""
    _conformance(ConformanceConfig(**config), check)


main.add_command(plan)

if __name__ == "__main__":
    main()
