"""A pass archives a chunk of runs per transaction, uploads concurrent: what fails in one run of a
chunk stays with that run; the others are archived and pruned all the same."""

import threading

from django.conf import settings
from django.db import connections
from django_tenants.utils import tenant_context

from runs.graphs.models import GraphWrite
from runs.retention import selectors, services, store
from runs.retention.envelope import ArchiveCorrupt
from runs.retention.models import Archive
from tests.retention.test_archive import hot_rows, without_archive
from tests.retention.test_failures import objects_of, oldest_runs


def assert_archived_and_pruned(run_id, *, history, tenant) -> None:
    archive = Archive.objects.get(run_id=run_id)
    assert archive.status == "archived" and archive.error == ""
    assert set(hot_rows(run_id).values()) == {0}
    assert objects_of(run_id) == [archive.object_key]
    assert without_archive(services.archive_restore(tenant=tenant, run_id=run_id)) == history


def test_a_failed_upload_leaves_its_run_hot_and_the_rest_of_the_chunk_archived(
        archive_pass, monkeypatch, in_acme):
    first, failing, third = runs = oldest_runs(3)
    histories = {run.id: selectors.run_history(run_id=run.id) for run in runs}
    before = hot_rows(failing.id)
    real_put = store.object_put_verified

    def put(*, key, blob, uploader=None):
        if str(failing.id) in key:
            raise ArchiveCorrupt(f"{key}: the object read back is not the one uploaded")
        return real_put(key=key, blob=blob, uploader=uploader)

    monkeypatch.setattr(store, "object_put_verified", put)
    report = archive_pass()

    assert report.failed == 1 and report.archived >= 2 and report.stopped == ""
    for run in (first, third):
        assert_archived_and_pruned(run.id, history=histories[run.id], tenant=in_acme)
    assert hot_rows(failing.id) == before
    failed = Archive.objects.get(run_id=failing.id)
    assert failed.status == "failed" and failed.attempts == 1
    assert "ArchiveCorrupt" in failed.error and objects_of(failing.id) == []

    monkeypatch.setattr(store, "object_put_verified", real_put)
    assert archive_pass().failed == 0
    assert_archived_and_pruned(failing.id, history=histories[failing.id], tenant=in_acme)
    assert Archive.objects.get(run_id=failing.id).attempts == 1  # kept: how often it failed


def test_a_run_whose_rows_changed_after_the_read_stays_hot_and_the_others_are_pruned(
        archive_pass, monkeypatch, in_acme):
    first, changed, third = runs = oldest_runs(3)
    histories = {run.id: selectors.run_history(run_id=run.id) for run in runs}
    before = hot_rows(changed.id)

    def write_to_its_thread(run_id):
        # A LangGraph write by thread id, from another connection: no run row lock stops it.
        if run_id != changed.id:
            return
        thread = threading.Thread(target=graph_write, args=(in_acme, str(run_id)))
        thread.start()
        thread.join(10)

    monkeypatch.setattr(services, "after_upload", write_to_its_thread)
    report = archive_pass()
    monkeypatch.setattr(services, "after_upload", None)

    assert report.failed == 1 and report.archived >= 2
    for run in (first, third):
        assert_archived_and_pruned(run.id, history=histories[run.id], tenant=in_acme)
    failed = Archive.objects.get(run_id=changed.id)
    assert failed.status == "failed" and "ArchiveRaced" in failed.error
    assert "graphs_write had 1 rows at prune time but 0 were archived" in failed.error
    assert hot_rows(changed.id) == {**before, "graphs_write": 1}  # nothing of it deleted

    assert archive_pass().failed == 0  # the next pass archives it with the row
    archive = Archive.objects.get(run_id=changed.id)
    assert archive.status == "archived" and archive.counts["graphs_write"] == 1
    assert set(hot_rows(changed.id).values()) == {0}


def graph_write(tenant, thread_id: str) -> None:
    try:
        with tenant_context(tenant):
            GraphWrite.objects.create(thread_id=thread_id, checkpoint_ns="", checkpoint_id="c1",
                                      task_id="t1", idx=0, channel="messages", type="json",
                                      blob=b"[]")
    finally:
        connections.close_all()


def test_archived_and_discarded_runs_share_a_chunk(archive_pass, in_acme):
    kept, discarded = runs = oldest_runs(2)
    services.run_retention_set(run_id=discarded.id, archive_required=False)
    history = selectors.run_history(run_id=kept.id)

    report = archive_pass()

    assert report.failed == 0 and report.discarded >= 1
    assert_archived_and_pruned(kept.id, history=history, tenant=in_acme)
    assert Archive.objects.get(run_id=discarded.id).status == "discarded"
    assert objects_of(discarded.id) == []
    for run in runs:
        assert set(hot_rows(run.id).values()) == {0}


def test_two_passes_at_once_never_take_the_same_run(archive_pass, monkeypatch, in_acme):
    runs = oldest_runs(4)
    other: dict = {}

    def second_pass_meanwhile(run_id):
        # The first pass holds its chunk's row locks (uploaded, not yet pruned): another pass
        # skips those runs rather than waiting for them or archiving them too.
        monkeypatch.setattr(services, "after_upload", None)
        thread = threading.Thread(target=other_pass, args=(in_acme, other))
        thread.start()
        thread.join(60)

    monkeypatch.setattr(settings, "RETENTION_CHUNK_SIZE", 2)
    monkeypatch.setattr(services, "after_upload", second_pass_meanwhile)
    report = archive_pass()

    assert "error" not in other, other
    assert report.failed == 0 and other["report"].failed == 0
    first_chunk, second_chunk = {run.id for run in runs[:2]}, {run.id for run in runs[2:]}
    assert other["archived"] >= second_chunk and not other["archived"] & first_chunk
    for run in runs:
        archive = Archive.objects.get(run_id=run.id)
        assert archive.status == "archived" and archive.attempts == 0
        assert set(hot_rows(run.id).values()) == {0} and objects_of(run.id) == [archive.object_key]


def other_pass(tenant, out: dict) -> None:
    try:
        with tenant_context(tenant):
            before = set(Archive.objects.values_list("run_id", flat=True))
            out["report"] = services.archive_pass(tenant=tenant)
            out["archived"] = set(Archive.objects.values_list("run_id", flat=True)) - before
    except Exception as exc:  # noqa: BLE001 - handed to the test
        out["error"] = exc
    finally:
        connections.close_all()
