"""deploy/ is checked, offline: the compose file against the Compose Specification's JSON schema
(vendored by check-jsonschema), every Kubernetes document against the Kubernetes JSON schemas in
strict mode (vendored by kubernetes-validate; what kubeconform does), and the invariants the
schemas cannot see: two hosts (their own MAKA_HOST and workspace volume, one shared task queue), one
shared PostgreSQL for
Temporal and the ledger, references that resolve. Each check has a broken copy it must refuse."""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
K8S_VERSIONS = ("1.28.0", "1.33.0")
#: Secrets the manifests reference but never ship (created by the operator, see deploy/README.md).
EXTERNAL_SECRETS = {"maka-ledger", "maka-temporal"}


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    return data


def k8s_docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def compose_errors(data: dict[str, Any]) -> list[str]:
    schema_file = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(data)]


def k8s_error(doc: dict[str, Any], version: str) -> str | None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as exc:
        return str(exc)
    return None


# --- compose --------------------------------------------------------------------------------------


def test_compose_file_matches_the_compose_spec() -> None:
    assert compose_errors(compose()) == []


def test_compose_schema_check_refuses_a_broken_file() -> None:
    broken = copy.deepcopy(compose())
    broken["services"]["worker-host-a"]["restart"] = ["always"]  # a list where a string goes
    broken["services"]["temporal"]["portz"] = ["7233:7233"]  # an unknown key
    assert len(compose_errors(broken)) >= 2


def _workers(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in data["services"].items() if name.startswith("worker-")}


def test_compose_runs_two_hosts_on_one_postgres_with_temporal_and_the_ui() -> None:
    data = compose()
    services = data["services"]
    workers = _workers(data)
    assert len(workers) == 2
    queues = {svc["environment"]["MAKA_TASK_QUEUE"] for svc in workers.values()}
    hosts = {svc["environment"]["MAKA_HOST"] for svc in workers.values()}
    assert len(queues) == 1 and len(hosts) == 2  # one workflow queue; each host its own host queue
    # each host has its own workspace and home; the ledger is the shared PostgreSQL
    mounts = [set(svc["volumes"]) for svc in workers.values()]
    assert not mounts[0] & mounts[1]
    assert all(any(v.endswith(":/workspaces") for v in m) for m in mounts)
    pg_host = "postgresql"
    for svc in workers.values():
        assert svc["environment"]["MAKA_DB"].startswith(f"postgresql+psycopg://maka:maka@{pg_host}:5432/maka")
        assert svc["environment"]["MAKA_METRICS_PORT"] == "9464"
        # a published port reaches the container's interface: the loopback default would hide it
        assert svc["environment"]["MAKA_METRICS_HOST"] == "0.0.0.0"
        assert svc["depends_on"]["postgresql"]["condition"] == "service_healthy"
    temporal = services["temporal"]["environment"]
    assert temporal["DB"].startswith("postgres") and temporal["POSTGRES_SEEDS"] == pg_host
    assert "temporal-ui" in services
    init = DEPLOY / "postgres-init"
    assert "CREATE DATABASE maka" in "".join(p.read_text() for p in init.glob("*.sql"))
    # every reference resolves: depends_on targets, named volumes, bind mounts, the Dockerfile
    for name, svc in services.items():
        for dep in svc.get("depends_on", {}):
            assert dep in services, (name, dep)
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if source.startswith("."):
                continue  # a bind mount beside the file (./workspaces is created by compose)
            assert source in data["volumes"], (name, source)
        build = svc.get("build")
        if build:
            assert (DEPLOY / build["context"] / build["dockerfile"]).is_file()
    assert (DEPLOY / "postgres-init").is_dir()
    ports = [p for svc in workers.values() for p in svc["ports"]]
    assert len({p.split(":")[0] for p in ports}) == 2


# --- kubernetes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_matches_the_kubernetes_schema(version: str) -> None:
    docs = k8s_docs()
    assert docs
    assert {d["kind"]: k8s_error(d, version) for d in docs} == {d["kind"]: None for d in docs}


def test_kubernetes_schema_check_refuses_a_broken_manifest() -> None:
    (sts, *_) = [d for d in k8s_docs() if d["kind"] == "StatefulSet"]
    wrong_type = copy.deepcopy(sts)
    wrong_type["spec"]["replicas"] = "1"
    unknown = copy.deepcopy(sts)
    unknown["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    assert k8s_error(wrong_type, K8S_VERSIONS[-1]) is not None
    assert k8s_error(unknown, K8S_VERSIONS[-1]) is not None


def _problems(docs: list[dict[str, Any]]) -> list[str]:
    """What kubeconform cannot see: hosts, volumes and references."""
    problems: list[str] = []
    named = {(d["kind"], d["metadata"]["name"]) for d in docs}
    config = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    sets = [d for d in docs if d["kind"] in ("StatefulSet", "Deployment")]
    queues: list[str] = []
    hosts: list[str] = []
    for d in sets:
        name, spec = d["metadata"]["name"], d["spec"]
        pod = spec["template"]["spec"]
        if spec.get("replicas") != 1:
            problems.append(f"{name}: a host runs exactly one replica")
        labels = spec["template"]["metadata"]["labels"]
        if any(labels.get(k) != v for k, v in spec["selector"]["matchLabels"].items()):
            problems.append(f"{name}: selector does not match the pod labels")
        if d["kind"] == "StatefulSet" and ("Service", spec["serviceName"]) not in named:
            problems.append(f"{name}: serviceName {spec['serviceName']} is not defined")
        volumes = {v["name"] for v in pod.get("volumes", [])}
        volumes |= {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
        (worker,) = pod["containers"]
        mounts = {m["mountPath"]: m["name"] for m in worker.get("volumeMounts", [])}
        if "/workspaces" not in mounts:
            problems.append(f"{name}: no workspace volume")
        problems += [f"{name}: volume {v} is not defined" for v in mounts.values() if v not in volumes]
        env: dict[str, Any] = {}
        for ref in worker.get("envFrom", []):
            if "configMapRef" in ref:
                env.update(config.get(ref["configMapRef"]["name"], {}))
                if ref["configMapRef"]["name"] not in config:
                    problems.append(f"{name}: configMap {ref['configMapRef']['name']} is not defined")
            secret = ref.get("secretRef", {}).get("name")
            if secret and ("Secret", secret) not in named and secret not in EXTERNAL_SECRETS:
                problems.append(f"{name}: secret {secret} is neither defined nor documented")
        env.update({e["name"]: e.get("value") for e in worker.get("env", [])})  # env wins over envFrom
        queues.append(str(env.get("MAKA_TASK_QUEUE")))
        hosts.append(str(env.get("MAKA_HOST")))
        ports = {p.get("name"): p["containerPort"] for p in worker.get("ports", [])}
        if str(ports.get("metrics")) != str(env.get("MAKA_METRICS_PORT")):
            problems.append(f"{name}: the metrics port is not the one the worker serves")
        if ports.get("metrics") is not None and env.get("MAKA_METRICS_HOST") != "0.0.0.0":
            problems.append(f"{name}: /metrics binds loopback, out of Prometheus' and the probe's reach")
    if len(sets) < 2 or len(set(hosts)) != len(hosts) or "None" in hosts:
        problems.append(f"want one set per host, each with its own MAKA_HOST: {hosts}")
    if len(set(queues)) != 1:
        problems.append(f"every host polls the one shared task queue: {queues}")
    return problems


def test_manifests_run_one_worker_per_host_with_its_workspace_volume() -> None:
    assert _problems(k8s_docs()) == []


def test_structural_check_refuses_shared_hosts_split_queues_and_dangling_volumes() -> None:
    docs = k8s_docs()
    broken = copy.deepcopy(docs)
    sets = [d for d in broken if d["kind"] == "StatefulSet"]
    for d in sets:
        env = d["spec"]["template"]["spec"]["containers"][0]["env"]
        for e in env:
            if e["name"] == "MAKA_HOST":
                e["value"] = "host-a"
    sets[1]["spec"]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "MAKA_TASK_QUEUE", "value": "maka-host-b"}
    )
    sets[0]["spec"]["volumeClaimTemplates"] = sets[0]["spec"]["volumeClaimTemplates"][:1]
    sets[1]["spec"]["replicas"] = 2
    problems = _problems(broken)
    assert any("own MAKA_HOST" in p for p in problems)
    assert any("one shared task queue" in p for p in problems)
    assert any("volume workspaces is not defined" in p for p in problems)
    assert any("exactly one replica" in p for p in problems)


def test_structural_check_refuses_metrics_bound_to_loopback() -> None:
    broken = copy.deepcopy(k8s_docs())
    for d in broken:
        if d["kind"] == "ConfigMap":
            d["data"].pop("MAKA_METRICS_HOST", None)  # the worker's default: loopback only
    assert any("binds loopback" in p for p in _problems(broken))


# --- Temporal Cloud through the standard environment configuration ---------------------------


def test_the_documented_cloud_settings_reach_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy/README's Temporal Cloud and mTLS settings, read by ``workers.client.connect`` through
    ``temporalio.envconfig``: API key implies TLS; TLS paths become the client's TLS config."""
    from maka_temporal.workers.client.connect import connect_config

    for name in ("TEMPORAL_CONFIG_FILE", "TEMPORAL_PROFILE", "TEMPORAL_TLS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(DEPLOY / "no-such-temporal.toml"))
    monkeypatch.setenv("TEMPORAL_ADDRESS", "my-ns.a1b2c.tmprl.cloud:7233")
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "my-ns.a1b2c")
    monkeypatch.setenv("TEMPORAL_API_KEY", "key-123")
    cloud = connect_config()
    assert cloud["target_host"] == "my-ns.a1b2c.tmprl.cloud:7233"
    assert cloud["namespace"] == "my-ns.a1b2c" and cloud["api_key"] == "key-123" and cloud["tls"]
    assert connect_config("other:7233", "ns2")["target_host"] == "other:7233"  # flags win

    monkeypatch.delenv("TEMPORAL_API_KEY")
    monkeypatch.setenv("TEMPORAL_TLS_SERVER_NAME", "frontend.internal")
    mtls = connect_config()
    assert "api_key" not in mtls and mtls["tls"].domain == "frontend.internal"
    readme = (DEPLOY / "README.md").read_text()
    for name in ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_API_KEY", "TEMPORAL_TLS_SERVER_NAME"):
        assert f"`{name}`" in readme
