"""The Kubernetes manifests (deploy/k8s): rendered by `kubectl kustomize` and checked for what
an operator relies on, and the dispatch backlog KEDA scales on, run against the real schema."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from bot.clock import VirtualClock
from bot.config import load_settings, secret_variables, variables
from bot.db import plain_url
from bot.model import LEVELS, Level
from bot.queue.sql.monitoring import DISPATCH_BACKLOG
from bot.queue.store import QueueStore
from tests.support.factories import decide, make_request, plans

REPO = Path(__file__).resolve().parents[2]
VARIABLES = variables()
SECRETS = secret_variables()
OVERLAYS = ("dev", "production")
SECRETS_DIR = "/run/secrets/review-bot"

Manifest = dict[str, Any]


def render(overlay: str) -> list[Manifest]:
    """`kubectl kustomize deploy/k8s/overlays/OVERLAY`, parsed; skips where kubectl is absent."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the manifests cannot be rendered here")
    done = subprocess.run(
        [kubectl, "kustomize", str(REPO / "deploy" / "k8s" / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [document for document in yaml.safe_load_all(done.stdout) if document]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> list[Manifest]:
    return render(str(request.param))


def one(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def workloads(manifests: list[Manifest]) -> Iterator[tuple[str, Manifest]]:
    """(name, pod spec) of every Deployment and Job."""
    for manifest in manifests:
        if manifest["kind"] in ("Deployment", "Job"):
            yield manifest["metadata"]["name"], manifest["spec"]["template"]["spec"]


def env_of(container: Manifest) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in container.get("env", [])}


def normalized(sql: str) -> str:
    return " ".join(sql.split())


def test_both_roles_probe_health_and_serve_on_the_ports_they_declare(
    rendered: list[Manifest],
) -> None:
    for name, role in (("review-bot-web", "web"), ("review-bot-dispatcher", "dispatcher")):
        deployment = one(rendered, "Deployment", name)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        args = container["args"]
        assert args[:3] == ["serve", "--role", role]
        assert "--no-migrate" in args  # the migrate Job does it
        port = int(args[args.index("--port") + 1])
        ports = {item["name"]: item["containerPort"] for item in container["ports"]}
        assert ports["http"] == port
        assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
        # Metrics on a port of their own, where the annotations send the scraper.
        config = one(rendered, "ConfigMap", config_name(rendered))["data"]
        assert ports["metrics"] == int(config["REVIEW_BOT_METRICS_PORT"])
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == config["REVIEW_BOT_METRICS_PORT"]
        assert annotations["prometheus.io/path"] == "/metrics"


def config_name(manifests: list[Manifest]) -> str:
    (config,) = [m for m in manifests if m["kind"] == "ConfigMap"]
    return str(config["metadata"]["name"])


def test_every_container_runs_non_root_on_a_read_only_root_with_resources(
    rendered: list[Manifest],
) -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    image_uid = int(re.search(r"--uid (\d+)", dockerfile)[1])  # type: ignore[index]
    seen = set()
    for name, pod in workloads(rendered):
        seen.add(name)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == image_uid
        assert pod["automountServiceAccountToken"] is False
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"]["drop"] == ["ALL"], name
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), name
            assert "memory" in resources["limits"], name
            # The one place a process may write is an emptyDir.
            mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
            assert "emptyDir" in volumes[mounts["/tmp"]], name
    assert seen == {"review-bot-web", "review-bot-dispatcher", "review-bot-migrate"}


def test_secrets_come_from_files_the_settings_read(rendered: list[Manifest]) -> None:
    secrets = {m["metadata"]["name"]: m for m in rendered if m["kind"] == "Secret"}
    for name, pod in workloads(rendered):
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        for container in pod["containers"]:
            mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
            secret_volume = volumes[mounts[SECRETS_DIR]["name"]]["secret"]
            assert mounts[SECRETS_DIR]["readOnly"] is True
            for variable, path in env_of(container).items():
                assert variable.endswith("_FILE"), f"{name}: {variable} is not from a file"
                # The settings read NAME or the file NAME_FILE names.
                assert variable.removesuffix("_FILE") in SECRETS, variable
                directory, _, key = path.rpartition("/")
                assert directory == SECRETS_DIR, (name, variable)
                if secrets:  # an overlay that makes the Secret has every key a pod reads
                    secret = secrets[secret_volume["secretName"]]
                    assert key in secret.get("data", {}), (name, variable, key)
    authentication = one(rendered, "TriggerAuthentication", "review-bot-postgres")
    (reference,) = authentication["spec"]["secretTargetRef"]
    assert reference["parameter"] == "connection" and reference["key"] == "database-url"
    if secrets:
        assert reference["name"] in secrets


def test_settings_in_the_config_map_are_read_and_documented(rendered: list[Manifest]) -> None:
    data = one(rendered, "ConfigMap", config_name(rendered))["data"]
    readme = (REPO / "README.md").read_text()
    for name in data:
        assert name in VARIABLES, f"{name} is not a setting bot.config reads"
        assert f"`{name}`" in readme, f"{name} is not in README.md"
    # What the manifests set is a configuration the bot accepts.
    environment = {key: value for key, value in data.items()}
    environment["DATABASE_URL"] = "postgresql://reviewbot@postgres:5432/reviewbot"
    settings = load_settings(environment)
    grace = settings.scheduler.shutdown_grace_s
    dispatcher = one(rendered, "Deployment", "review-bot-dispatcher")
    pod = dispatcher["spec"]["template"]["spec"]
    # The drain fits in the pod's grace with room to hand back what runs and close.
    assert grace + 10 <= pod["terminationGracePeriodSeconds"]


def test_images_agree_with_compose_and_each_other(rendered: list[Manifest]) -> None:
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    compose_image = compose["services"]["web"]["image"].partition(":")[0]
    images = {
        container["image"] for _, pod in workloads(rendered) for container in pod["containers"]
    }
    assert len(images) == 1, images  # every role runs the same release
    (image,) = images
    assert image.partition(":")[0].rpartition("/")[2] == compose_image
    assert ":" in image  # a tag, set by the overlay


def test_roles_and_secrets_agree_with_compose_and_the_env_example(
    rendered: list[Manifest],
) -> None:
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]
    example = (REPO / ".env.example").read_text()
    named = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", example, re.MULTILINE))
    for role in ("web", "dispatcher"):
        (container,) = one(rendered, "Deployment", f"review-bot-{role}")["spec"]["template"][
            "spec"
        ]["containers"]
        # The same command as compose runs, but for the migration the Job does.
        assert [arg for arg in container["args"] if arg != "--no-migrate"] == compose[role][
            "command"
        ]
        for variable in env_of(container):
            setting = variable.removesuffix("_FILE")
            if setting == "DATABASE_URL":
                # compose builds it from POSTGRES_PASSWORD; here it is a secret of its own.
                assert "DATABASE_URL" in compose[role]["environment"]
                continue
            assert {setting, variable} & named, f"{variable}: .env.example says nothing of it"


def test_disruption_budgets_select_their_roles_pods(rendered: list[Manifest]) -> None:
    budgets = [m for m in rendered if m["kind"] == "PodDisruptionBudget"]
    assert {budget["metadata"]["name"] for budget in budgets} == {
        "review-bot-web",
        "review-bot-dispatcher",
    }
    for budget in budgets:
        deployment = one(rendered, "Deployment", budget["metadata"]["name"])
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        selector = budget["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items()
        # ...and no other workload's pods.
        for name, _ in workloads(rendered):
            if name != budget["metadata"]["name"]:
                other = next(
                    m
                    for m in rendered
                    if m["kind"] in ("Deployment", "Job") and m["metadata"]["name"] == name
                )
                assert (
                    not selector.items() <= other["spec"]["template"]["metadata"]["labels"].items()
                )


def test_dispatchers_scale_on_the_tested_backlog_query(rendered: list[Manifest]) -> None:
    scaled = one(rendered, "ScaledObject", "review-bot-dispatcher")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "review-bot-dispatcher"
    dispatcher = one(rendered, "Deployment", "review-bot-dispatcher")
    assert "replicas" not in dispatcher["spec"]  # KEDA owns it
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    assert normalized(trigger["metadata"]["query"]) == normalized(DISPATCH_BACKLOG)
    assert float(trigger["metadata"]["targetQueryValue"]) > 0
    assert trigger["authenticationRef"]["name"] == "review-bot-postgres"
    assert scaled["spec"]["minReplicaCount"] >= 1


def test_the_migrate_job_upgrades_the_database(rendered: list[Manifest]) -> None:
    job = one(rendered, "Job", "review-bot-migrate")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["db", "upgrade"]
    assert env_of(container) == {"DATABASE_URL_FILE": f"{SECRETS_DIR}/database-url"}


async def _backlog(store: QueueStore) -> int:
    conn = await asyncpg.connect(plain_url(store.engine.url.render_as_string(False)))
    try:
        return int(await conn.fetchval(DISPATCH_BACKLOG))
    finally:
        await conn.close()


async def test_the_backlog_counts_what_waits_for_a_dispatcher(store: QueueStore) -> None:
    # The scaler's query reads the database's now(): the queue's times are real ones here.
    clock = VirtualClock(datetime.now(UTC).replace(microsecond=0))
    assert await _backlog(store) == 0
    unplanned = await store.submit_request(make_request(number=1), decide(), now=clock.now())
    assert await _backlog(store) == 1  # planned by a dispatcher: it counts before its chunks
    planned = await store.submit_request(
        make_request(number=2, head_sha="2" * 40), decide(Level.P2), now=clock.now()
    )
    assert planned.job_id is not None and unplanned.job_id is not None
    await store.plan_job(planned.job_id, plans(10, 10, 10), now=clock.now())
    assert await _backlog(store) == 1 + 3
    running = await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60)
    assert running is not None
    assert await _backlog(store) == 1 + 3  # a running chunk still needs its dispatcher
    await store.finish_chunk(running.chunk.id, owner="w", now=clock.now(), gpu_seconds=1, result={})
    assert await _backlog(store) == 1 + 2
    # A chunk whose retry is due later waits for no dispatcher until then.
    failing = await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60)
    assert failing is not None
    await store.fail_chunk(
        failing.chunk.id, owner="w", now=clock.now(), error="HTTP 503", retryable=True
    )
    assert await _backlog(store) == 1 + 1
    await store.plan_job(unplanned.job_id, plans(10), now=clock.now())
    assert await _backlog(store) == 1 + 1


async def test_the_backlog_query_reads_its_indexes(store: QueueStore) -> None:
    clock = VirtualClock(datetime.now(UTC).replace(microsecond=0))
    for number in range(1, 31):
        result = await store.submit_request(
            make_request(number=number, head_sha=f"{number:040d}"), decide(), now=clock.now()
        )
        assert result.job_id is not None
        if number % 3:
            await store.plan_job(result.job_id, plans(5, 5), now=clock.now())
    conn = await asyncpg.connect(plain_url(store.engine.url.render_as_string(False)))
    try:
        # A queue in production is mostly history: finished reviews and chunks the scaler
        # must not read.
        await conn.execute(
            """
            INSERT INTO review_chunks (job_id, seq, level, state, available_at, lines)
            SELECT j.id, 100 + g, j.level, 'done', now() - interval '1 day', 5
            FROM review_jobs j CROSS JOIN generate_series(1, 1000) AS g
            """
        )
        await conn.execute(
            """
            INSERT INTO review_jobs
            SELECT (jsonb_populate_record(NULL::review_jobs, to_jsonb(j) || jsonb_build_object(
                'id', nextval('review_jobs_id_seq'), 'dedupe_key', 'done-' || g,
                'state', 'done', 'planned', true))).*
            FROM (SELECT * FROM review_jobs LIMIT 1) AS j CROSS JOIN generate_series(1, 5000) AS g
            """
        )
        await conn.execute("VACUUM ANALYZE review_chunks")
        await conn.execute("VACUUM ANALYZE review_jobs")
        plan = "\n".join(row[0] for row in await conn.fetch("EXPLAIN " + DISPATCH_BACKLOG))
    finally:
        await conn.close()
    assert "Index Only Scan using ix_review_chunks_backlog" in plan, plan
    assert "ix_review_jobs_unplanned" in plan, plan
    assert "Seq Scan" not in plan, plan
