"""Rolling deploys: a worker that lacks a run's agent version hands it to one that has it, and
an operator can move a waiting or failed run to a newer version of its agent."""

import time

import pytest
from django.core.management import call_command

from agentplatform import localprocs
from runs.approvals.models import Approval
from runs.models import Run, RunEvent
from runs.services import RunError, run_migrate, run_start
from tests.conftest import LOGS
from tests.support import rollout_v2_agents  # noqa: F401  (this process knows v2 and v3)
from tests.support.runs import finished, kinds, start
from tests.support.waiting import wait_for


@pytest.fixture
def two_deploys(beat, celery_queue_clean):
    """An old worker (v1 only, like the session's) and, when asked, a new one (v1 and v2)."""
    started = []

    def start_worker(name: str, modules: str) -> localprocs.Worker:
        process = localprocs.Worker(f"{name}-{time.monotonic_ns()}", 1, log_dir=LOGS,
                                    env={"AGENT_MODULES": modules})
        started.append(process)
        return process.wait_ready()

    yield start_worker
    for process in started:
        process.stop()


def test_a_run_on_a_version_only_new_workers_have_waits_for_one(in_acme, two_deploys):
    old = "agents,tests.support.agents,tests.support.sandbox_agents,tests.support.engine_agents"
    two_deploys("old-deploy", old)
    run = run_start(agent="rollout", version=2).run
    wait_for(lambda: RunEvent.objects.filter(run=run, kind="agent_unknown_here").exists(),
             timeout=60, interval=0.1, what="an old worker to hand the run back")
    assert Run.objects.get(id=run.id).status in ("queued", "running")  # not parked
    new = two_deploys("new-deploy", old + ",tests.support.rollout_v2_agents")
    done = wait_for(lambda: Run.objects.filter(id=run.id, status__in=Run.FINISHED).first(),
                    timeout=90, interval=0.2, what="a new worker to finish the run")
    assert done.status == "succeeded" and done.result["version"] == 2
    assert int(done.result["worker"].rsplit(":", 1)[1]) in new.pids()
    assert "resume_refused" not in kinds(done)


def test_migrate_a_failed_run_to_a_newer_version_through_the_api(in_acme, acme_api):
    run = finished(start("rollout", version=1, input={"v1_breaks": True}).id)
    assert run.status == "failed"
    refused = acme_api.post(f"/api/v1/runs/{run.id}/migrate", {"version": 3}, format="json")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "step_missing"
    response = acme_api.post(f"/api/v1/runs/{run.id}/migrate", {"version": 2}, format="json")
    assert response.status_code == 200, response.json()
    # in line again (or already taken by a worker of the session: the answer reads it after commit)
    assert response.json()["agent_version"] == 2 and response.json()["status"] in ("queued",
                                                                                   "running")
    event = RunEvent.objects.get(run=run, kind="run_migrated")
    assert (event.data["from_version"], event.data["to_version"]) == (1, 2)
    again = acme_api.post(f"/api/v1/runs/{run.id}/migrate", {"version": 2}, format="json")
    assert again.status_code == 409  # queued now: nothing to migrate


def test_migrate_refuses_unknown_and_older_versions(in_acme):
    run = finished(start("rollout", version=2).id)
    with pytest.raises(RunError) as finished_run:
        run_migrate(run_id=run.id, version=3, by="test")
    assert finished_run.value.code == "run_not_migratable"
    failed = finished(start("rollout", version=1, input={"v1_breaks": True}).id)
    for version, code in [(1, "version_not_newer"), (7, "unknown_agent")]:
        with pytest.raises(RunError) as refused:
            run_migrate(run_id=failed.id, version=version, by="test")
        assert refused.value.code == code


def test_migrate_a_run_waiting_on_an_approval_only_changes_its_pin(in_acme):
    run = start("rollout", version=1)
    Run.objects.filter(id=run.id).update(status="waiting", waiting_reason="approval: ok?")
    Approval.objects.create(run=run, visit=0, request={"title": "ok?"}, then="work")
    migrated = run_migrate(run_id=run.id, version=2, by="test")
    assert (migrated.status, migrated.agent_version) == ("waiting", 2)
    assert migrated.waiting_reason == "approval: ok?"


def test_run_migrate_management_command(in_acme):
    run = finished(start("rollout", version=1, input={"v1_breaks": True}).id)
    call_command("run_migrate", "acme", str(run.id), "2")
    assert Run.objects.get(id=run.id).agent_version == 2
