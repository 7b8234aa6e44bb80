"""deploy/k8s: every manifest is valid against Kubernetes' own JSON schemas (kubernetes-validate's
strict schemas: unknown fields, wrong types and missing required fields fail) or, for the
ServiceMonitor, the vendored schema under tests/schemas/; and the manifests fit together and keep
the daemon's rules (replicas, probes, resources, settings, the shutdown grace). A broken manifest
fails both kinds of check."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tiered_memory.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
SERVICEMONITOR_SCHEMA = Path(__file__).resolve().parent / "schemas" / "servicemonitor.schema.json"
# The oldest Kubernetes the schemas ship and the newest: the manifests hold for every release between.
KUBERNETES_VERSIONS = ("1.25", kubernetes_validate.latest_version())

Manifests = dict[str, dict[str, Any]]
_KINDS = ("ConfigMap", "Secret", "Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor")


def load_manifests() -> Manifests:
    """The resources kustomization.yaml lists, by kind."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    out: Manifests = {}
    for name in kustomization["resources"]:
        doc = yaml.safe_load((K8S / name).read_text(encoding="utf-8"))
        assert doc["kind"] not in out, f"two {doc['kind']} manifests"
        out[doc["kind"]] = doc
    return out


def schema_errors(doc: dict[str, Any]) -> list[str]:
    """Schema violations of one manifest, empty when it is valid."""
    if doc.get("kind") == "ServiceMonitor":
        schema = json.loads(SERVICEMONITOR_SCHEMA.read_text(encoding="utf-8"))
        validator = jsonschema.Draft202012Validator(schema)
        return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
    errors = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{doc.get('kind')} (Kubernetes {version}) {list(exc.absolute_path)}: {exc.message}")
    return errors


def _pod(m: Manifests) -> dict[str, Any]:
    template: dict[str, Any] = m["Deployment"]["spec"]["template"]
    return template


def _container(m: Manifests) -> dict[str, Any]:
    container: dict[str, Any]
    (container,) = (c for c in _pod(m)["spec"]["containers"] if c["name"] == "tiered-memory")
    return container


def pod_env(m: Manifests) -> dict[str, str]:
    """The daemon's environment as the pod gets it: the ConfigMap, then the Secret."""
    env: dict[str, str] = {}
    for source in _container(m)["envFrom"]:
        if "configMapRef" in source:
            env |= m["ConfigMap"]["data"]
        if "secretRef" in source:
            env |= m["Secret"]["stringData"]
    env |= {e["name"]: e["value"] for e in _container(m).get("env", [])}
    return env


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def policy_problems(m: Manifests) -> list[str]:
    """What breaks the daemon's rules or the manifests' fit with one another; empty when none."""
    checks = (
        _deployment_problems,
        _settings_problems,
        _security_problems,
        _service_problems,
        _pdb_problems,
        _monitor_problems,
    )
    return [problem for check in checks for problem in check(m)]


def _container_ports(m: Manifests) -> dict[str, int]:
    """The daemon container's ports, by name."""
    return {p["name"]: p["containerPort"] for p in _container(m)["ports"]}


def _service_ports(m: Manifests) -> dict[str, dict[str, Any]]:
    """The Service's ports, by name."""
    return {p["name"]: p for p in m["Service"]["spec"]["ports"]}


def _deployment_problems(m: Manifests) -> list[str]:
    """Replicas, the selector, the probes, and every container's requests and env sources."""
    problems = []
    deployment, pod = m["Deployment"], _pod(m)
    container = _container(m)
    if deployment["spec"]["replicas"] < 2:
        problems.append("Deployment: replicas must be at least 2")
    if not _matches(deployment["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"]):
        problems.append("Deployment: selector does not match the pod's labels")
    ports = _container_ports(m)
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") not in (*ports, *ports.values()):
            problems.append(f"Deployment: {probe} must GET {path} on the container's port")
    for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
        requests = c.get("resources", {}).get("requests", {})
        if not {"cpu", "memory"} <= set(requests):
            problems.append(f"Deployment: container {c['name']} needs cpu and memory requests")
        refs = {next(iter(s.values()))["name"] for s in c.get("envFrom", [])}
        if refs != {m["ConfigMap"]["metadata"]["name"], m["Secret"]["metadata"]["name"]}:
            problems.append(f"Deployment: container {c['name']} must take its env from the ConfigMap and Secret")
    return problems


def _settings_problems(m: Manifests) -> list[str]:
    """The settings the pod gets: the daemon takes them, listens on the container's port, and
    finishes its shutdown within the pod's grace; and none is unknown to it."""
    problems = []
    try:
        settings = Settings.from_env(pod_env(m))
    except Exception as exc:  # noqa: BLE001 - the message is the finding
        problems.append(f"ConfigMap/Secret: the daemon refuses these settings: {exc}")
    else:
        if settings.port not in _container_ports(m).values():
            problems.append("ConfigMap: PORT is not the container's port")
        pre_stop = _container(m).get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        pause = float(pre_stop[1]) if pre_stop[:1] == ["sleep"] else 0.0
        grace = _pod(m)["spec"].get("terminationGracePeriodSeconds", 30)
        if grace <= pause + settings.shutdown_grace_seconds:
            problems.append(
                f"Deployment: terminationGracePeriodSeconds ({grace}) must exceed the preStop pause ({pause})"
                f" plus SHUTDOWN_GRACE_SECONDS ({settings.shutdown_grace_seconds})"
            )
    names = {f.alias for f in Settings.model_fields.values()}
    unknown = (set(m["ConfigMap"]["data"]) | set(m["Secret"]["stringData"])) - names
    if unknown:
        problems.append(f"ConfigMap/Secret: not settings of the daemon: {sorted(unknown)}")
    return problems


def _security_problems(m: Manifests) -> list[str]:
    security = _pod(m)["spec"].get("securityContext", {})
    if not security.get("runAsNonRoot") or security.get("runAsUser", 0) == 0:
        return ["Deployment: the pod must run as a non-root user"]
    return []


def _service_problems(m: Manifests) -> list[str]:
    problems = []
    if not _matches(m["Service"]["spec"]["selector"], _pod(m)["metadata"]["labels"]):
        problems.append("Service: selector does not match the pod's labels")
    ports = _container_ports(m)
    if any(p["targetPort"] not in (*ports, *ports.values()) for p in _service_ports(m).values()):
        problems.append("Service: targetPort is not a port of the container")
    return problems


def _pdb_problems(m: Manifests) -> list[str]:
    problems = []
    pdb = m["PodDisruptionBudget"]["spec"]
    if not _matches(pdb["selector"]["matchLabels"], _pod(m)["metadata"]["labels"]):
        problems.append("PodDisruptionBudget: selector does not match the pod's labels")
    if not 1 <= pdb.get("minAvailable", 0) < m["Deployment"]["spec"]["replicas"]:
        problems.append("PodDisruptionBudget: minAvailable must be at least 1 and leave a replica to evict")
    return problems


def _monitor_problems(m: Manifests) -> list[str]:
    problems = []
    monitor = m["ServiceMonitor"]["spec"]
    if not _matches(monitor["selector"]["matchLabels"], m["Service"]["metadata"]["labels"]):
        problems.append("ServiceMonitor: selector does not match the Service's labels")
    service_ports = _service_ports(m)
    if any(e.get("port") not in service_ports or e.get("path") != "/metrics" for e in monitor["endpoints"]):
        problems.append("ServiceMonitor: every endpoint must scrape /metrics on a named port of the Service")
    return problems


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)
    assert set(load_manifests()) == set(_KINDS)


@pytest.mark.parametrize("kind", _KINDS)
def test_manifest_matches_its_schema(kind: str) -> None:
    assert schema_errors(load_manifests()[kind]) == []


def test_manifests_keep_the_daemons_rules() -> None:
    assert policy_problems(load_manifests()) == []


def test_pod_runs_as_the_images_user() -> None:
    """The pod's uid and gid are the ones the Dockerfile creates and switches to."""
    dockerfile = (ROOT / "deploy" / "docker" / "Dockerfile").read_text(encoding="utf-8")
    (user,) = re.findall(r"^USER (\d+):(\d+)$", dockerfile, flags=re.MULTILINE)
    security = load_manifests()["Deployment"]["spec"]["template"]["spec"]["securityContext"]
    assert (str(security["runAsUser"]), str(security["runAsGroup"])) == user


def test_secret_holds_example_values_only() -> None:
    """The committed Secret says it is an example, and its values say so too."""
    text = (K8S / "secret.yaml").read_text(encoding="utf-8")
    assert "EXAMPLE VALUES ONLY" in text
    for value in load_manifests()["Secret"]["stringData"].values():
        assert "example" in value


def _set(path: str, value: Any) -> Callable[[Manifests], None]:
    kind, *keys = path.split(".")

    def mutate(m: Manifests) -> None:
        node: Any = m[kind]
        for key in keys[:-1]:
            node = node[int(key)] if key.isdigit() else node[key]
        if value is _DELETE:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value

    return mutate


_DELETE = object()
_CONTAINER = "Deployment.spec.template.spec.containers.0"


@pytest.mark.parametrize(
    ("mutate", "kind"),
    [
        (_set("Deployment.spec.replicas", "2"), "Deployment"),  # a string where an integer goes
        (_set(f"{_CONTAINER}.readinesProbe", {"httpGet": {"path": "/readyz", "port": "http"}}), "Deployment"),
        (_set(f"{_CONTAINER}.name", _DELETE), "Deployment"),  # a required field
        (_set("Deployment.spec.selector", _DELETE), "Deployment"),
        (_set("Service.spec.ports.0.port", "eighty"), "Service"),
        (_set("PodDisruptionBudget.spec.minAvailable", [1]), "PodDisruptionBudget"),
        (_set("ConfigMap.data.PORT", 8080), "ConfigMap"),  # ConfigMap values are strings
        (_set("ServiceMonitor.spec.endpoints.0.interval", "15 seconds"), "ServiceMonitor"),
        (_set("ServiceMonitor.spec.selector", _DELETE), "ServiceMonitor"),
        (_set("ServiceMonitor.spec.endpoints.0.paht", "/metrics"), "ServiceMonitor"),
    ],
)
def test_schema_check_refuses_a_broken_manifest(mutate: Callable[[Manifests], None], kind: str) -> None:
    manifests = copy.deepcopy(load_manifests())
    mutate(manifests)
    assert schema_errors(manifests[kind])


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (_set("Deployment.spec.replicas", 1), "replicas must be at least 2"),
        (_set(f"{_CONTAINER}.readinessProbe.httpGet.path", "/healthz"), "readinessProbe must GET /readyz"),
        (_set(f"{_CONTAINER}.livenessProbe", _DELETE), "livenessProbe must GET /healthz"),
        (_set(f"{_CONTAINER}.resources.requests", {"memory": "256Mi"}), "needs cpu and memory requests"),
        (_set("Deployment.spec.template.spec.terminationGracePeriodSeconds", 15), "terminationGracePeriodSeconds"),
        (_set("ConfigMap.data.SHUTDOWN_GRACE_SECONDS", "25"), "terminationGracePeriodSeconds"),
        (_set("ConfigMap.data.SUMMARY_EVERY_N_TURN", "3"), "not settings of the daemon"),
        (_set("ConfigMap.data.HISTORY_TTL_SECONDS", "99999"), "refuses these settings"),
        (_set("ConfigMap.data.PORT", "9000"), "PORT is not the container's port"),
        (_set("Service.spec.selector", {"app.kubernetes.io/name": "other"}), "Service: selector"),
        (_set("PodDisruptionBudget.spec.minAvailable", 2), "minAvailable"),
        (_set("ServiceMonitor.spec.endpoints.0.port", "metrics"), "ServiceMonitor: every endpoint"),
        (_set("Deployment.spec.template.spec.securityContext.runAsUser", 0), "non-root"),
    ],
)
def test_policy_check_refuses_a_broken_manifest(mutate: Callable[[Manifests], None], problem: str) -> None:
    manifests = copy.deepcopy(load_manifests())
    mutate(manifests)
    found = policy_problems(manifests)
    assert any(problem in p for p in found), found
