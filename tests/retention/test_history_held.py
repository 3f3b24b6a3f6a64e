"""Checkpoints and log entries have no foreign key to their run in the database: each writer
holds the run's row instead (runs/models.py HISTORY_HELD_BY_RUN). The archive pass locks the
runs it prunes before it reads their rows, so a checkpoint being written keeps its run hot
until a later pass, and one that waited for the pass finds no run: none outlives its run."""

import threading

from django.db import connection, connections, transaction
from django_tenants.utils import tenant_context

from runs.engine.outcome import LeaseLost
from runs.engine.store import checkpoint_commit
from runs.engine.writer import Position
from runs.models import Checkpoint, Run
from runs.retention import services
from runs.retention.models import Archive
from tests.retention.test_archive import hot_rows
from tests.retention.test_failures import oldest_runs
from tests.support.runs import waiting_on_a_lock
from tests.support.waiting import wait_for

DEADLINE = 20


def _write_checkpoint(run: Run, *, commit: threading.Event | None = None,
                      written: threading.Event | None = None,
                      latest: Checkpoint | None = None) -> None:
    """A fenced checkpoint after the run's last (`latest`, else read), as its lease's holder
    writes one; held open (its run row locked FOR SHARE) until `commit` is set."""
    latest = latest or Checkpoint.objects.filter(run_id=run.id).order_by("-visit").first()
    with transaction.atomic():
        checkpoint_commit(run=run, epoch=run.lease_epoch, touch_run=False, position=Position(
            visit=latest.visit + 1, step=None, state={"late": True},
            offsets=dict(latest.log_offsets)))
        if written is not None:
            written.set()
        if commit is not None:
            assert commit.wait(DEADLINE), "the test never let the write commit"


def _writing(tenant, run: Run, outcome: list, **events) -> threading.Thread:
    """`_write_checkpoint` in a thread of its own (its own connection); `outcome` gets its
    backend's pid, then what it raised (None if it wrote)."""
    def write():
        try:
            with tenant_context(tenant):
                outcome.append(connection.cursor().connection.info.backend_pid)
                _write_checkpoint(run, **events)
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            outcome.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=write)
    thread.start()
    return thread


def test_a_checkpoint_that_waits_for_the_archive_finds_its_run_gone(
        archive_pass, monkeypatch, in_acme):
    (raced,) = oldest_runs(1)
    outcome, threads = [], []

    def race(run_id):  # the run is archived, not pruned yet: its row is locked
        if run_id != raced.id or threads:
            return
        threads.append(_writing(in_acme, raced, outcome))
        wait_for(lambda: outcome and waiting_on_a_lock(outcome[0]), timeout=DEADLINE,
                 interval=0.02, what="the checkpoint's fence to wait for the archive's lock")

    monkeypatch.setattr(services, "after_upload", race)
    report = archive_pass()
    monkeypatch.setattr(services, "after_upload", None)
    threads[0].join(DEADLINE)

    assert report.archived >= 1 and Archive.objects.get(run_id=raced.id).status == "archived"
    assert isinstance(outcome[1], LeaseLost) and "not written" in str(outcome[1])
    assert set(hot_rows(raced.id).values()) == {0}  # no checkpoint left without its run


def test_a_run_whose_checkpoint_is_being_written_is_left_to_a_later_pass(archive_pass, in_acme):
    (busy,) = oldest_runs(1)
    before = hot_rows(busy.id)
    commit, written, outcome = threading.Event(), threading.Event(), []
    thread = _writing(in_acme, busy, outcome, commit=commit, written=written)
    try:
        assert written.wait(DEADLINE), outcome
        archive_pass()
        assert hot_rows(busy.id) == before  # skipped (its row is locked): nothing pruned
    finally:
        commit.set()
        thread.join(DEADLINE)
    assert outcome[1] is None
    assert hot_rows(busy.id)["runs_checkpoint"] == before["runs_checkpoint"] + 1
    archive_pass()
    assert set(hot_rows(busy.id).values()) == {0}
    assert Archive.objects.get(run_id=busy.id).status == "archived"


def test_a_checkpoint_for_a_pruned_run_is_refused(archive_pass, in_acme):
    (gone,) = oldest_runs(1)
    latest = Checkpoint.objects.filter(run_id=gone.id).order_by("-visit").first()
    assert archive_pass().archived >= 1 and hot_rows(gone.id)["runs_run"] == 0
    try:
        _write_checkpoint(gone, latest=latest)
    except LeaseLost as exc:
        assert "not written" in str(exc)
    else:
        raise AssertionError("a checkpoint was written for a run that is gone")
    assert not Checkpoint.objects.filter(run_id=gone.id).exists()
