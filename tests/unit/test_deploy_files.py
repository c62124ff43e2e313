"""The cluster image recipe and the KubeRay example hold together (no docker or cluster here).

- deploy/Dockerfile takes nothing from the repository but the wheels `uv build --all-packages`
  writes, installs all of them, and starts from a Ray image whose version dlu-prime accepts
  and uv.lock pins.
- deploy/kuberay/*.yaml parse; the job spec is valid; its Redis URL names the Redis Service and
  port; its isolation resources are offered by the head and the worker groups; every Ray pod
  runs the image the Dockerfile builds.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from dlu_api.spec.io import load_spec

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
KUBERAY = ROOT / "deploy" / "kuberay"
PACKAGES = ("dlu-api", "dlu-prime", "dlu-elastic", "dlu-store-redis")


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def wheel_names() -> list[str]:
    """The wheel file names `uv build --all-packages` writes (pure-Python packages)."""
    names = []
    for package in PACKAGES:
        project = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["project"]
        names.append(f"{project['name'].replace('-', '_')}-{project['version']}-py3-none-any.whl")
    return names


def test_dockerfile_copies_only_built_wheels() -> None:
    copies = [rest for keyword, rest in dockerfile_instructions() if keyword in ("COPY", "ADD")]
    assert copies, "the Dockerfile must COPY the wheels"
    sources: list[str] = []
    for rest in copies:
        assert not rest.startswith("--from"), "no multi-stage copies: wheels are the only input"
        *srcs, _dest = rest.split()
        sources += srcs
    wheels = wheel_names()
    for source in sources:
        assert source.startswith("dist/") and source.endswith(".whl"), f"{source}: only dist/*.whl"
        pattern = re.escape(source.removeprefix("dist/")).replace(r"\*", ".*")
        assert any(re.fullmatch(pattern, w) for w in wheels), f"{source} matches no built wheel"
    for wheel in wheels:  # every package is copied ...
        assert any(
            re.fullmatch(re.escape(s.removeprefix("dist/")).replace(r"\*", ".*"), wheel) for s in sources
        )
    installs = " ".join(rest for keyword, rest in dockerfile_instructions() if keyword == "RUN")
    for wheel in wheels:  # ... and installed
        assert f"/{wheel.split('-')[0]}-*.whl" in installs, f"{wheel} is not installed"


def test_dockerfile_base_image_has_the_locked_ray() -> None:
    args = dict(
        rest.split("=", 1) for keyword, rest in dockerfile_instructions() if keyword == "ARG" and "=" in rest
    )
    image = args["RAY_IMAGE"]
    assert image.startswith("rayproject/ray:")
    ray_version = image.split(":", 1)[1].split("-", 1)[0]
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    (locked,) = [p["version"] for p in lock["package"] if p["name"] == "ray"]
    assert ray_version == locked
    prime = tomllib.loads((ROOT / "packages/dlu-prime/pyproject.toml").read_text())["project"]
    (ray_req,) = [Requirement(r) for r in prime["dependencies"] if Requirement(r).name == "ray"]
    assert Version(ray_version) in ray_req.specifier
    python_tag = image.split("-py", 1)[1].split("-", 1)[0]  # e.g. 311
    assert int(python_tag) >= 311, "DLU needs Python 3.11+"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((KUBERAY / name).read_text(encoding="utf-8")) if d]


def _resources(ray_start_params: dict[str, str]) -> dict[str, float]:
    raw = ray_start_params.get("resources", "{}")
    raw = yaml.safe_load(raw) if raw.startswith('"') else raw  # KubeRay's quoted JSON string
    value: dict[str, float] = yaml.safe_load(raw)
    return value


@pytest.fixture(scope="module")
def cluster() -> dict[str, dict[str, Any]]:
    docs = _docs("raycluster.yaml")
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def test_kuberay_job_uses_the_cluster_redis(cluster: dict[str, dict[str, Any]]) -> None:
    spec = load_spec(KUBERAY / "job.yaml")
    assert spec.state_store.name == "redis"
    url = urlparse(str(spec.state_store.options["url"]))
    service = cluster[f"Service/{url.hostname}"]
    assert url.port in [p["port"] for p in service["spec"]["ports"]]
    deployment = cluster[f"Deployment/{url.hostname}"]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    ports = [
        p["containerPort"] for c in deployment["spec"]["template"]["spec"]["containers"] for p in c["ports"]
    ]
    target = next(p["targetPort"] for p in service["spec"]["ports"] if p["port"] == url.port)
    assert target in ports


def test_kuberay_resources_and_images_fit_the_job(cluster: dict[str, dict[str, Any]]) -> None:
    spec = load_spec(KUBERAY / "job.yaml")
    (ray_cluster,) = [d for key, d in cluster.items() if key.startswith("RayCluster/")]
    head = ray_cluster["spec"]["headGroupSpec"]
    groups = ray_cluster["spec"]["workerGroupSpecs"]
    assert spec.master.isolation_resource in _resources(head["rayStartParams"])
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"  # the job server, reachable
    worker_pods = [
        g for g in groups if spec.master.worker_isolation_resource in _resources(g["rayStartParams"])
    ]
    assert sum(g["replicas"] for g in worker_pods) >= spec.node_num  # STRICT_SPREAD: a pod per node
    images = {c["image"] for t in [head, *groups] for c in t["template"]["spec"]["containers"]}
    assert images == {"dlu-ray:0.1.0"}
    assert "dlu-ray:0.1.0" in DOCKERFILE.read_text()
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    (locked,) = [p["version"] for p in lock["package"] if p["name"] == "ray"]
    assert ray_cluster["spec"]["rayVersion"] == locked
