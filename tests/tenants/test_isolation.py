"""Two tenants, acme and globex: what one writes, the other cannot see by any path."""

from django_tenants.utils import tenant_context

from agentplatform.celery import app
from runs.models import Run
from runs.services import run_start
from runs.tasks import run_status


def test_acme_run_is_invisible_to_globex_through_the_orm(acme, globex):
    with tenant_context(acme):
        run = run_start(agent="research", input={"topic": "secret"}, enqueue=False).run
        assert Run.objects.filter(id=run.id).exists()
    with tenant_context(globex):
        assert not Run.objects.filter(id=run.id).exists()
        assert not Run.objects.filter(input__topic="secret").exists()


def test_acme_run_is_404_with_globex_key(acme, acme_api, globex_api):
    created = acme_api.post("/api/v1/runs", {"agent": "research", "input": {"iterations": 1}},
                            format="json")
    assert created.status_code == 201, created.content
    run_id = created.json()["id"]
    assert acme_api.get(f"/api/v1/runs/{run_id}").status_code == 200
    for path in ("", "/events", "/checkpoints", "/checkpoints/0/state"):
        response = globex_api.get(f"/api/v1/runs/{run_id}{path}")
        assert response.status_code == 404, (path, response.content)
        assert response.json()["error"]["code"] == "not_found"
    assert globex_api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 404
    assert globex_api.post(f"/api/v1/runs/{run_id}/fork", {"visit": 0},
                           format="json").status_code == 404
    assert run_id not in globex_api.get("/api/v1/runs").content.decode()


def test_task_carrying_globex_schema_cannot_see_acme_run_in_a_real_worker(acme, globex, worker):
    with tenant_context(acme):
        run = run_start(agent="research", input={}, enqueue=False).run
        seen_by_acme = run_status.apply_async(args=[str(run.id)]).get(timeout=30)
    with tenant_context(globex):
        seen_by_globex = run_status.apply_async(args=[str(run.id)]).get(timeout=30)
    assert seen_by_acme == {"schema": "acme", "found": True, "status": "queued", "steps_taken": 0}
    assert seen_by_globex == {"schema": "globex", "found": False}


def test_task_without_a_tenant_header_is_refused_not_run_in_some_schema(worker):
    result = app.send_task("runs.run_status", args=["00000000-0000-0000-0000-000000000000"],
                           headers={"_schema_name": "public"})
    try:
        result.get(timeout=30)
    except Exception as exc:  # the worker's exception, re-raised here
        assert "tenant schema" in str(exc)
    else:
        raise AssertionError("a task in the public schema must be refused")
