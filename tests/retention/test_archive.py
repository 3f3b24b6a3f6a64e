"""Archive -> prune -> restore: the history comes back as it was; nothing else is touched."""

import stat
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentplatform.s3 import s3_client
from runs.graphs.models import GraphCheckpoint
from runs.models import Checkpoint, LogEntry, Run, RunEvent
from runs.retention import selectors, services
from runs.retention.models import Archive
from runs.services import run_start
from tests.retention.conftest import run_finished


def hot_rows(run_id) -> dict[str, int]:
    counts = {"runs_run": Run.objects.filter(id=run_id).count()}
    for table in selectors.run_tables():
        counts[table.name] = table.model._default_manager.filter(
            **{table.field.attname: table.key(run_id)}).count()
    return counts


def without_archive(history: dict) -> dict:
    return {k: v for k, v in history.items() if k != "archive"}


def test_archived_run_restores_to_its_original_history(archive_pass, in_acme, acme_api):
    run = run_finished(steps=8)
    services.run_retention_set(run_id=run.id, ttl=timedelta(days=7))  # a row in another table
    live = selectors.run_history(run_id=run.id)
    live_events = acme_api.get(f"/api/v1/runs/{run.id}/events").json()["results"]
    live_checkpoints = acme_api.get(f"/api/v1/runs/{run.id}/checkpoints").json()["results"]
    connection.set_tenant(in_acme)  # the API request ended in the public schema
    assert len(live["checkpoints"]) == 10 and len(live["log_entries"]) == 8
    assert live["related"]["retention_runretention"][0]["ttl"] == "P7DT00H00M00S"

    report = archive_pass()

    assert report.archived >= 1 and report.failed == 0
    assert set(hot_rows(run.id).values()) == {0}
    archive = Archive.objects.get(run_id=run.id)
    assert archive.status == "archived"
    assert archive.object_key == f"tenants/acme/archives/{run.id}.jsonl.gz.enc"
    assert {table: n for table, n in archive.counts.items() if n} == {
        "runs_run": 1, "runs_runevent": 2, "runs_checkpoint": 10, "runs_logentry": 8,
        "retention_runretention": 1}
    stored = s3_client().get_object(Bucket=settings.S3_BUCKET, Key=archive.object_key)["Body"].read()
    assert len(stored) == archive.size and b"message 000001" not in stored  # encrypted

    restored = services.archive_restore(tenant=in_acme, run_id=run.id)
    assert without_archive(restored) == live
    response = acme_api.get(f"/api/v1/runs/{run.id}/archive")
    connection.set_tenant(in_acme)
    assert response.status_code == 200
    body = response.json()
    assert body["events"] == live_events and body["checkpoints"] == live_checkpoints
    assert body["run"]["id"] == str(run.id) and body["run"]["status"] == "succeeded"
    assert body["archive"]["sha256"] == archive.sha256
    assert acme_api.get(f"/api/v1/runs/{run.id}").status_code == 404  # no longer hot


def test_a_second_pass_finds_nothing_to_do_and_changes_nothing(archive_pass):
    run = run_finished()
    archive_pass()
    before = Archive.objects.get(run_id=run.id)
    report = archive_pass()
    assert Archive.objects.filter(run_id=run.id).count() == 1
    assert Archive.objects.get(run_id=run.id).sha256 == before.sha256
    assert report.failed == 0


def test_unfinished_runs_and_runs_within_ttl_are_never_touched(archive_pass):
    queued = run_start(agent="chatter", input={"steps": 3}, enqueue=False).run
    Run.objects.filter(id=queued.id).update(created_at=timezone.now() - timedelta(days=400))
    waiting = run_finished(steps=2)
    Run.objects.filter(id=waiting.id).update(status=Run.Status.WAITING, finished_at=None)
    recent = run_finished(steps=2, age=timedelta(days=29))
    kept_longer = run_finished(steps=2)
    services.run_retention_set(run_id=kept_longer.id, ttl=timedelta(days=90))
    before = {run.id: hot_rows(run.id) for run in (queued, waiting, recent, kept_longer)}

    archive_pass()

    for run_id, counts in before.items():
        assert hot_rows(run_id) == counts
        assert not Archive.objects.filter(run_id=run_id).exists()


def test_each_run_is_due_by_its_own_ttl_and_a_backlog_not_due_holds_back_none(archive_pass):
    then = timezone.now() - timedelta(days=5000)  # as of then, no other test's run is due

    def finished(days: float, ttl: timedelta | None = None, **kwargs) -> Run:
        run = run_finished(**kwargs)
        Run.objects.filter(id=run.id).update(finished_at=then - timedelta(days=days))
        if ttl is not None:
            services.run_retention_set(run_id=run.id, ttl=ttl)
        return run

    oldest = finished(40)  # past the tenant's 30 days
    # older than the runs due behind them, and than the shortest TTL (tidy's day), but within
    # their own: the tenant's 30 days, and an override's 90 over tidy's day
    backlog = [finished(10 + i) for i in range(4)] + [finished(9, agent="tidy", ttl=timedelta(days=90))]
    shortened = finished(3, ttl=timedelta(days=1))  # the tenant's agent, its own day
    tidy = finished(2, agent="tidy")  # its agent's day
    finished(0.5, agent="tidy")  # within that day

    with CaptureQueriesContext(connection) as queries:
        due = selectors.runs_due(now=then, limit=3)
    assert [run_id for run_id, _ in due] == [oldest.id, shortened.id, tidy.id]
    policies = dict(due)
    assert (policies[shortened.id].history, policies[shortened.id].ttl) == ("full", timedelta(days=1))
    assert (policies[tidy.id].history, policies[tidy.id].ttl) == ("shallow", timedelta(days=1))
    assert [run_id for run_id, _ in selectors.runs_due(now=then, limit=2)] == [oldest.id, shortened.id]
    # each pick of runs stops at its batch in the database, not after reading the backlog
    picks = [q["sql"] for q in queries.captured_queries if 'FROM "runs_run"' in q["sql"]]
    assert picks and all("LIMIT" in sql for sql in picks), picks
    archive_pass()  # all of them are long due now: none is left hot for other tests
    assert Archive.objects.filter(run_id__in=[oldest.id, shortened.id, tidy.id, *(r.id for r in backlog)],
                                  status="archived").count() == 8


@pytest.mark.parametrize("ttl", [timedelta(0), timedelta(seconds=-1), timedelta(days=3650, seconds=1),
                                 timedelta.max])
def test_a_runs_ttl_out_of_bounds_is_refused_and_the_pass_goes_on(archive_pass, ttl):
    # timedelta.max would put the run's due time past PostgreSQL's timestamps: its tenant's
    # every pass would fail on the pick
    run = run_finished(steps=2)
    with pytest.raises(services.RetentionError, match="more than 0 and at most 3650 days"):
        services.run_retention_set(run_id=run.id, ttl=ttl)
    services.run_retention_set(run_id=run.id, ttl=timedelta(days=3650))  # the bound itself
    due = run_finished(steps=2)  # the pass is not stopped by the first one's ten years
    archive_pass()
    assert Archive.objects.filter(run_id=due.id, status="archived").exists()
    assert not Archive.objects.filter(run_id=run.id).exists()


def test_agent_policy_without_archive_prunes_without_an_object(archive_pass):
    run = run_finished()
    services.run_retention_set(run_id=run.id, archive_required=False)
    archive_pass()
    archive = Archive.objects.get(run_id=run.id)
    assert archive.status == "discarded" and archive.object_key == "" and archive.counts["runs_run"] == 1
    assert set(hot_rows(run.id).values()) == {0}


def test_restore_command_prints_the_history(archive_pass, capsys):
    run = run_finished(steps=3)
    live = selectors.run_history(run_id=run.id)
    archive_pass()
    connection.set_schema_to_public()
    call_command("restore_archive", "acme", str(run.id))
    printed = capsys.readouterr().out
    assert f'"id": "{run.id}"' in printed and '"run_succeeded"' in printed
    assert printed.count('"visit"') >= len(live["checkpoints"])
    with pytest.raises(CommandError, match="not_found"):
        call_command("restore_archive", "globex", str(run.id))


def test_restored_archive_file_is_readable_by_its_owner_only(archive_pass, tmp_path):
    run = run_finished(steps=2)
    archive_pass()
    connection.set_schema_to_public()
    fresh, existing = tmp_path / "fresh.json", tmp_path / "existing.json"
    existing.write_text("older")
    existing.chmod(0o644)
    for output in (fresh, existing):
        call_command("restore_archive", "acme", str(run.id), output=str(output))
        assert stat.S_IMODE(output.stat().st_mode) == 0o600
        assert f'"id": "{run.id}"' in output.read_text()


def test_append_only_guard_still_refuses_outside_the_prune_path(in_acme):
    from django.db import DatabaseError, transaction

    run = run_finished(steps=1)
    for model in (RunEvent, Checkpoint, LogEntry):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            model.objects.filter(run_id=run.id).delete()


def test_a_graph_runs_langgraph_thread_is_archived_and_pruned_with_it(archive_pass, in_acme):
    run = run_finished(agent="graph-chatter", steps=4)
    assert run.status == "succeeded" and run.result["said"][-1] == "message 000004"
    live = selectors.run_history(run_id=run.id)
    graph_rows = {table: len(live["related"][table])
                  for table in ("graphs_checkpoint", "graphs_blob", "graphs_write")}
    assert graph_rows["graphs_checkpoint"] >= 5 and graph_rows["graphs_blob"] >= 4
    assert GraphCheckpoint.objects.filter(thread_id=str(run.id)).count() == graph_rows[
        "graphs_checkpoint"]  # the thread is the run

    archive_pass()

    assert set(hot_rows(run.id).values()) == {0}  # the graph's tables included
    assert not GraphCheckpoint.objects.filter(thread_id=str(run.id)).exists()
    archive = Archive.objects.get(run_id=run.id)
    assert {table: archive.counts[table] for table in graph_rows} == graph_rows
    restored = services.archive_restore(tenant=in_acme, run_id=run.id)
    assert without_archive(restored) == live
