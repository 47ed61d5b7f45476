"""docker-compose.yml: the multi-machine shape. No Docker engine runs here, so the file is read and its
services and wiring asserted; `docker-compose config` (Debian's package parses without an engine) checks
it the way Docker will, when installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
KF_SERVICES = ("migrate", "worker-cpu")
ROLE_PASSWORDS = {
    match.group(1): match.group(2)
    for match in re.finditer(
        r"CREATE ROLE (\w+) LOGIN PASSWORD '([^']*)';", (ROOT / "docker" / "postgres-init.sql").read_text()
    )
}
"""The login roles docker/postgres-init.sql creates, with their passwords."""


def load(text: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(text)
    return document


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    services: dict[str, Any] = load(COMPOSE.read_text())["services"]
    return services


@pytest.fixture(scope="module")
def gpu_worker(services: dict[str, Any]) -> dict[str, Any]:
    """The worker-gpu service (started only with the gpu profile)."""
    worker: dict[str, Any] = services["worker-gpu"]
    return worker


def test_the_stack_has_its_services(services: dict[str, Any]) -> None:
    assert set(services) == {"postgres", "temporal", "temporal-ui", "migrate", "worker-cpu", "worker-gpu"}
    assert services["postgres"]["image"].startswith("postgres:16")
    assert services["temporal"]["image"].startswith("temporalio/auto-setup:")
    assert services["temporal-ui"]["image"].startswith("temporalio/ui:")


def test_temporal_and_its_ui_use_the_postgres_service(services: dict[str, Any]) -> None:
    temporal = services["temporal"]["environment"]
    postgres = services["postgres"]["environment"]
    assert temporal["DB"] == "postgres12" and temporal["POSTGRES_SEEDS"] == "postgres"
    assert (temporal["POSTGRES_USER"], temporal["POSTGRES_PWD"]) == (
        postgres["POSTGRES_USER"],
        postgres["POSTGRES_PASSWORD"],
    )
    assert services["temporal-ui"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert "8233:8080" in services["temporal-ui"]["ports"]


@pytest.mark.parametrize("name", KF_SERVICES)
def test_kf_services_point_at_the_stack(services: dict[str, Any], name: str) -> None:
    service = services[name]
    assert service["build"] == "."
    environment = service["environment"]
    url = urlsplit(environment["KF_DATABASE_URL"])
    assert (url.hostname, url.port, url.path) == ("postgres", 5432, "/kf")
    # The application connects as the role that may only append to and read the log; only the one-shot
    # that applies migrations knows the owner's password.
    assert (url.username, url.password) == ("kf_app", ROLE_PASSWORDS["kf_app"])
    if name == "migrate":
        owner = urlsplit(environment["KF_DATABASE_OWNER_URL"])
        assert (owner.hostname, owner.port, owner.path) == ("postgres", 5432, "/kf")
        assert (owner.username, owner.password) == ("kf_owner", ROLE_PASSWORDS["kf_owner"])
    else:
        assert "KF_DATABASE_OWNER_URL" not in environment
    assert environment["KF_TEMPORAL_ADDRESS"] == "temporal:7233"


def test_postgres_creates_the_event_logs_roles_and_database(services: dict[str, Any]) -> None:
    mounted = {volume.split(":")[1]: volume.split(":")[0] for volume in services["postgres"]["volumes"]}
    script = ROOT / mounted["/docker-entrypoint-initdb.d/10-kf-roles.sql"]
    assert script.is_file()
    assert "CREATE DATABASE kf OWNER kf_owner;" in script.read_text()


def test_healthchecks_gate_every_dependency(services: dict[str, Any]) -> None:
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert "health" in services["temporal"]["healthcheck"]["test"]
    for name, service in services.items():
        for dependency, rule in service.get("depends_on", {}).items():
            expected = "service_completed_successfully" if dependency == "migrate" else "service_healthy"
            assert rule == {"condition": expected}, f"{name} -> {dependency}"
            if expected == "service_healthy":
                assert "healthcheck" in services[dependency], dependency
    assert set(services["worker-cpu"]["depends_on"]) == {"postgres", "temporal", "migrate"}
    assert services["worker-cpu"]["command"] == ["worker"]
    assert services["migrate"]["command"] == ["up"]


def test_the_gpu_worker_reserves_an_nvidia_gpu(gpu_worker: dict[str, Any], services: dict[str, Any]) -> None:
    devices = gpu_worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}]
    # Only with `--profile gpu`: a host without the NVIDIA Container Toolkit starts the rest as before.
    assert gpu_worker["profiles"] == ["gpu"]
    assert gpu_worker["command"] == ["worker", "--no-control"]
    assert "compute" in gpu_worker["environment"]["NVIDIA_DRIVER_CAPABILITIES"]
    assert (
        gpu_worker["environment"]["KF_TEMPORAL_ADDRESS"] == services["worker-cpu"]["environment"]["KF_TEMPORAL_ADDRESS"]
    )
    assert gpu_worker["environment"]["KF_DATABASE_URL"] == services["worker-cpu"]["environment"]["KF_DATABASE_URL"]
    assert gpu_worker["depends_on"] == services["worker-cpu"]["depends_on"]


def test_the_image_runs_kf() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["kf"]' in dockerfile
    assert re.search(r"^USER (?!root)", dockerfile, re.MULTILINE)


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed")
@pytest.mark.parametrize("profile", [[], ["--profile", "gpu"]], ids=["as-shipped", "gpu-profile"])
def test_docker_compose_accepts_the_file(profile: list[str]) -> None:
    result = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), *profile, "config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "worker-gpu:" in result.stdout
