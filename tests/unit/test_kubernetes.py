"""deploy/kubernetes/: the kustomize base rendered (as `kustomize build` would: a list of
resources and common labels, nothing else) and every object validated offline, the Kubernetes
ones against the schemas `kubernetes-validate` ships, the KEDA ones against KEDA's CRD
vendored in tests/schemas/; and the manifests run the processes of
tailguard/launch/processes.py, with probes, GPUs, stop times and scaling that fit them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from conftest import ROOT

from tailguard import settings
from tailguard.lanes.table import LaneTable, default_lanes_path, load_lanes
from tailguard.launch.processes import API, FLOWER, REDIS, WORKER, Process, deployment

BASE = ROOT / "deploy" / "kubernetes" / "base"
KEDA_CRD = ROOT / "tests" / "schemas" / "keda-v2.20.2-scaledobjects.yaml"
#: the fields of kustomization.yaml that `render` carries out the way kustomize does
KUSTOMIZE_FIELDS = {"apiVersion", "kind", "labels", "resources"}
WORKLOADS = ("Deployment", "StatefulSet")


def render(base: Path) -> list[dict]:
    """The base's objects: each resource file's documents, with the common labels in their
    metadata (kustomize's `labels` without includeSelectors/includeTemplates does just that)."""
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    assert set(kustomization) <= KUSTOMIZE_FIELDS, "render() does not carry out those fields"
    pairs: dict[str, str] = {}
    for entry in kustomization.get("labels", []):
        assert set(entry) == {"pairs"}
        pairs.update(entry["pairs"])
    objects = []
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((base / name).read_text()):
            if doc is not None:
                doc["metadata"].setdefault("labels", {}).update(pairs)
                objects.append(doc)
    return objects


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return render(BASE)


@pytest.fixture(scope="module")
def shipped() -> LaneTable:
    return load_lanes(default_lanes_path())


@pytest.fixture(scope="module")
def processes(shipped) -> dict[str, Process]:
    return {p.name: p for p in deployment(shipped)}


def of_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def workloads(objects: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] in WORKLOADS}


def container(workload: dict) -> dict:
    (main,) = workload["spec"]["template"]["spec"]["containers"]
    return main


def env_of(main: dict, objects: list[dict]) -> dict[str, object]:
    """A container's environment: its ConfigMaps' data, then its own `env` (value or source)."""
    maps = of_kind(objects, "ConfigMap")
    env: dict[str, object] = {}
    for source in main.get("envFrom", []):
        env.update(maps[source["configMapRef"]["name"]]["data"])
    for var in main.get("env", []):
        env[var["name"]] = var.get("value", var.get("valueFrom"))
    return env


def strict(schema: object) -> object:
    """A CRD's structural schema that refuses unknown fields (the API server would prune them
    silently: a misspelt field would be lost, not refused)."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    return schema


def crd_schema(path: Path, version: str) -> dict:
    crd = next(d for d in yaml.safe_load_all(path.read_text()) if d)
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return strict(served["schema"]["openAPIV3Schema"])


# --- valid objects --------------------------------------------------------------------------

def test_the_kustomization_lists_every_manifest_once():
    listed = yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in BASE.glob("*.yaml")
                                    if p.name != "kustomization.yaml")
    assert len(set(listed)) == len(listed)


def test_every_kubernetes_object_is_valid_against_the_schemas(objects):
    version = kubernetes_validate.latest_version()
    checked = 0
    for obj in objects:
        if obj["apiVersion"].startswith("keda.sh/"):
            continue
        kubernetes_validate.validate(obj, version, strict=True)
        checked += 1
    assert checked >= 10


def test_the_validation_refuses_a_misspelt_field(objects):
    bad = {**of_kind(objects, "Service")["api"]}
    bad["spec"] = {**bad["spec"], "selectr": bad["spec"]["selector"]}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, kubernetes_validate.latest_version(), strict=True)


def test_every_scaled_object_is_valid_against_kedas_crd(objects):
    scaled = [o for o in objects if o["kind"] == "ScaledObject"]
    assert scaled
    schema = crd_schema(KEDA_CRD, "v1alpha1")
    for obj in scaled:
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        jsonschema.validate(obj, schema)
        spec = obj["spec"]  # the CRD's CEL rule, which jsonschema does not run
        assert spec.get("minReplicaCount", 0) <= spec.get("maxReplicaCount", 100)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**scaled[0], "spec": {**scaled[0]["spec"], "cooldown": 1}}, schema)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl here; render() stands in")
def test_kubectl_kustomize_renders_what_render_does(objects):
    out = subprocess.run(["kubectl", "kustomize", str(BASE)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    key = lambda o: (o["kind"], o["metadata"]["name"])
    assert sorted(yaml.safe_load_all(out.stdout), key=key) == sorted(objects, key=key)


# --- the processes ---------------------------------------------------------------------------

def test_the_manifests_run_the_processes(objects, processes):
    """One workload per process, each running its `tailguard` command (Redis: redis-server,
    as compose runs it); nothing else runs, no controller."""
    found = workloads(objects)
    assert set(found) == set(processes)
    assert found[REDIS]["kind"] == "StatefulSet"
    assert container(found[REDIS])["command"][0] == "redis-server"
    for name, p in processes.items():
        if p.role == REDIS:
            continue
        command = container(found[name])["command"]
        assert tuple(command[:len(p.argv)]) == p.argv, name
        assert all(a.startswith("--") for a in command[len(p.argv)::2]), "only bind options"


def test_a_worker_is_one_engine_on_one_gpu_that_drains_before_it_is_killed(objects, processes):
    found = workloads(objects)
    for name, p in processes.items():
        if p.role != WORKER:
            continue
        pod = found[name]["spec"]["template"]["spec"]
        main = container(found[name])
        assert main["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert pod["terminationGracePeriodSeconds"] >= p.stop_grace_s, name
        env = env_of(main, objects)
        port = int(env[settings.WORKER_METRICS_PORT.env])
        assert env[settings.WORKER_METRICS_ADDR.env] == "0.0.0.0"  # the kubelet asks the pod IP
        ports = {c["name"]: c["containerPort"] for c in main["ports"]}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = main[probe]["httpGet"]
            assert get["path"] == "/livez" and ports[get["port"]] == port, (name, probe)
        assert any(v["mountPath"] == "/data/hf" for v in main["volumeMounts"])


def test_the_api_is_live_when_it_answers_and_ready_when_redis_does(objects):
    main = container(workloads(objects)[API])
    assert main["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # longer than the longest /readyz waits for Redis, so a slow Redis reads as unready
    assert main["readinessProbe"]["timeoutSeconds"] > settings.REDIS_SOCKET_TIMEOUT_S.default
    env = env_of(main, objects)
    assert settings.API_AUTH.env not in env and settings.API_OPEN.env not in env  # keys mode


def test_every_pod_reaches_redis_through_the_secret_and_flower_asks_a_password(objects, processes):
    found = workloads(objects)
    for name in processes:
        if name != REDIS:
            env = env_of(container(found[name]), objects)
            assert env[settings.REDIS_URL.env] == {
                "secretKeyRef": {"name": "tailguard-redis", "key": "url"}}, name
    flower = env_of(container(found[FLOWER]), objects)
    assert flower[settings.FLOWER_BASIC_AUTH.env] == {
        "secretKeyRef": {"name": "tailguard-flower", "key": "basic-auth"}}


def test_every_tailguard_variable_is_a_setting(objects):
    known = {s.env for s in settings.ALL}
    for workload in workloads(objects).values():
        for main in workload["spec"]["template"]["spec"].get("initContainers", []) + [
                container(workload)]:
            unknown = {v for v in env_of(main, objects) if v.startswith("TAILGUARD_")} - known
            assert not unknown, workload["metadata"]["name"]


def test_the_secrets_in_the_repository_are_placeholders(objects):
    for secret in of_kind(objects, "Secret").values():
        for value in secret["stringData"].values():
            assert "REPLACE-ME" in value


def test_redis_has_aof_a_password_and_the_embedded_ones_disabled_commands(objects):
    from tailguard.host.redis_server import DISABLED_COMMANDS

    args = container(workloads(objects)[REDIS])["command"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    renamed = {args[i + 1] for i, a in enumerate(args) if a == "--rename-command"
               and args[i + 2] == ""}
    assert renamed == set(DISABLED_COMMANDS)


def test_a_disruption_budget_covers_the_api_and_every_worker(objects, processes):
    budgets = [b["spec"]["selector"]["matchLabels"] for b in
               of_kind(objects, "PodDisruptionBudget").values()]
    found = workloads(objects)
    for name, p in processes.items():
        if p.role in (API, WORKER):
            labels = found[name]["spec"]["template"]["metadata"]["labels"]
            assert any(b.items() <= labels.items() for b in budgets), name


# --- scaling ---------------------------------------------------------------------------------

def query_lanes(query: str) -> tuple[str, ...]:
    """The lanes a query's `lane` matcher names (= "x" or =~ "x|y")."""
    m = re.search(r'lane\s*(=~?)\s*"([^"]+)"', query)
    assert m, query
    return tuple(m.group(2).split("|"))


def test_every_worker_kind_scales_on_its_lanes_backlog_tokens(objects, processes, shipped):
    scaled = {o["spec"]["scaleTargetRef"]["name"]: o["spec"]
              for o in objects if o["kind"] == "ScaledObject"}
    workers = {name: p for name, p in processes.items() if p.role == WORKER}
    assert set(scaled) == set(workers)
    for name, p in workers.items():
        spec = scaled[name]
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "prometheus"
        query = trigger["metadata"]["query"]
        assert "tailguard_lane_backlog_tokens" in query
        assert "max by (lane)" in query  # every API pod exports the same value
        # the interactive lanes' backlog: batch waits for what they leave
        assert query_lanes(query) == tuple(l for l in p.lanes
                                           if shipped[l].priority == "interactive"), name
        assert float(trigger["metadata"]["threshold"]) > 0
        # one warm engine stays for the short lane: a cold start takes minutes
        assert spec["minReplicaCount"] >= 1
        assert spec["maxReplicaCount"] >= max(1, spec["minReplicaCount"])
        assert spec["cooldownPeriod"] > 0
        assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"][
            "stabilizationWindowSeconds"] > 0


def test_a_fleet_scaled_to_zero_queues_requests_for_the_backlog_to_start_a_worker(objects):
    """With no live worker the API would answer 503 no_live_worker and queue nothing: the
    backlog that starts a worker would stay 0."""
    scaled = [o["spec"] for o in objects if o["kind"] == "ScaledObject"]
    if any(s["minReplicaCount"] == 0 for s in scaled):
        env = env_of(container(workloads(objects)[API]), objects)
        assert settings.ADMIT_WITHOUT_WORKER.parse(env[settings.ADMIT_WITHOUT_WORKER.env])
