"""Sandboxed steps in runs: recorded calls, encrypted workspace snapshots, resumes on other
workers, limits under real workers, and two tenants side by side."""

import json
import re
import shutil
import socket
import threading
import uuid
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidTag
from django.conf import settings
from django.db import connection, connections
from django_tenants.utils import tenant_context

import sandboxes.services as sandbox_services
from agentplatform.s3 import s3_client
from runs import engine
from runs.models import Run
from runs.services import run_start
from runs.tasks import advance
from sandboxes.models import SandboxExecution, WorkspaceSnapshot
from sandboxes.services import (
    SandboxSession,
    run_dir,
    snapshot_open,
    workspace_restore,
    workspace_snapshot,
)
from tenants.services import data_key_get
from tests.support.waiting import wait_for


def finished(run_id):
    outcome = engine.advance(run_id=run_id, sleep=lambda s: None, slice_seconds=600)
    assert outcome == engine.Outcome.ENDED, outcome
    return Run.objects.get(id=run_id)


def sandboxed(steps, **input):
    return run_start(agent="sandboxed", input={"steps": steps, **input}, enqueue=False).run


def test_rerun_step_replays_its_recorded_sandbox_call_instead_of_running_it(in_acme, s3):
    run = sandboxed([["echo x >> count.txt; wc -l < count.txt"]], break_after_sandbox_at=0)
    run = finished(run.id)
    assert run.status == "succeeded", run.error
    [[first]] = run.result["results"]
    assert first["stdout"].strip() == "1" and first["replayed"]  # attempt 2 got the record
    assert SandboxExecution.objects.filter(run=run).count() == 1
    # The step runs again on a worker with no local copy (crash before its checkpoint):
    # the workspace comes back from the snapshot and the call is still not redone.
    shutil.rmtree(run_dir(schema="acme", run_id=run.id))
    again = SandboxSession(run_id=run.id, visit=0)
    replay = again.run("echo x >> count.txt; wc -l < count.txt")
    assert replay.replayed and replay.stdout.strip() == "1"
    assert again.read("count.txt") == b"x\n"


def test_reused_call_name_with_another_command_is_refused(in_acme, s3):
    run = finished(sandboxed([["true"]]).id)
    with pytest.raises(Exception, match="recorded with another command"):
        SandboxSession(run_id=run.id, visit=0).run("false")


def test_workspace_snapshot_is_encrypted_under_the_tenants_prefix(in_acme, acme, globex, s3):
    run = finished(sandboxed([["echo plain-text-marker > a.txt"], ["cat a.txt"]]).id)
    assert run.status == "succeeded", run.error
    snapshots = list(WorkspaceSnapshot.objects.filter(run=run).order_by("visit"))
    assert [s.visit for s in snapshots] == [0]  # step 2 changed nothing: no new snapshot
    snapshot = snapshots[0]
    assert re.fullmatch(rf"tenants/acme/workspaces/{run.id}/0\.[0-9a-f]{{12}}\.tar\.gz\.enc",
                        snapshot.object_key)  # a key of its own for every write
    blob = s3_client().get_object(Bucket=settings.S3_BUCKET, Key=snapshot.object_key)["Body"].read()
    assert b"plain-text-marker" not in blob and b"a.txt" not in blob
    _, key = data_key_get(tenant=acme, version=snapshot.key_version)
    assert snapshot_open(blob, key=key, schema="acme", run_id=run.id, visit=0)
    with pytest.raises(InvalidTag):  # moved to another visit, run or tenant: refused
        snapshot_open(blob, key=key, schema="acme", run_id=run.id, visit=1)
    with pytest.raises(InvalidTag):
        snapshot_open(blob, key=key, schema="globex", run_id=run.id, visit=0)
    with pytest.raises(InvalidTag):
        snapshot_open(blob, key=data_key_get(tenant=globex)[1], schema="acme", run_id=run.id,
                      visit=0)
    assert SandboxExecution.objects.filter(run=run, durable=True).count() == 2


def test_half_a_step_left_by_a_dead_process_is_discarded_before_the_next_call(in_acme, s3):
    run = finished(sandboxed([["echo one > a.txt"]]).id)
    session = SandboxSession(run_id=run.id, visit=1)
    session.run("echo half > b.txt")  # never completed: no snapshot, not durable
    meta = session.local.meta()
    session.local.meta_write(**{**meta, "dirty_by": "elsewhere:1:dead"})  # that process died
    fresh = SandboxSession(run_id=run.id, visit=1)
    result = fresh.run("echo half > b.txt")
    assert not result.replayed  # its record was not durable: run again on the snapshot
    assert fresh.run("ls").stdout.split() == ["a.txt", "b.txt"]


def test_parallel_restores_of_one_snapshot_do_not_wait_for_each_other(in_acme, acme, s3,
                                                                     tmp_path, monkeypatch):
    """Fan-out branches restore the run's snapshot at once: none holds it across its S3 GET, and
    one whose object was replaced meanwhile (the snapshot re-taken) reads the new one."""
    source = tmp_path / "workspace"
    source.mkdir()
    (source / "f.txt").write_text("before the fan-out")
    run = run_start(agent="research", enqueue=False).run
    snapshot = workspace_snapshot(schema="acme", run_id=run.id, visit=2, path=source)
    fetching, release = threading.Event(), threading.Event()
    real_client = sandbox_services.s3_client

    class SlowGet:  # the first branch's GET stalls (a slow S3)
        def __init__(self):
            self.client = real_client()

        def get_object(self, **kwargs):
            if threading.current_thread().name == "first":
                fetching.set()
                assert release.wait(30)
            return self.client.get_object(**kwargs)

        def __getattr__(self, name):
            return getattr(self.client, name)

    monkeypatch.setattr(sandbox_services, "s3_client", SlowGet)
    restored: dict = {}

    def branch(name):
        try:
            with tenant_context(acme):
                path = tmp_path / name
                path.mkdir()
                workspace_restore(schema="acme", snapshot=snapshot, path=path)
                restored[name] = (path / "f.txt").read_text()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            restored[name] = exc
        finally:
            connections.close_all()

    first = threading.Thread(target=branch, args=("first",), name="first")
    first.start()
    try:
        wait_for(fetching.is_set, what="the first branch fetching")
        second = threading.Thread(target=branch, args=("second",), name="second")
        second.start()
        wait_for(lambda: "second" in restored, timeout=15,
                 what="the second branch's restore while the first waits on S3")
        assert restored["second"] == "before the fan-out"
        (source / "f.txt").write_text("re-taken")  # the object the first branch read is replaced
        workspace_snapshot(schema="acme", run_id=run.id, visit=2, path=source)
    finally:
        release.set()
        first.join(30)
    assert restored["first"] == "re-taken"


def test_a_worker_killed_between_upload_and_record_leaves_the_recorded_snapshot_intact(
        in_acme, s3, tmp_path, monkeypatch):
    source = tmp_path / "workspace"
    source.mkdir()
    (source / "f.txt").write_text("attempt 1")
    run = run_start(agent="research", enqueue=False).run
    workspace_snapshot(schema="acme", run_id=run.id, visit=5, path=source)
    (source / "f.txt").write_text("attempt 2")  # the step ran again after a crash

    class Killed(BaseException):
        pass

    def killed(**kwargs):
        raise Killed  # kill -9 after the object is uploaded, before its row is updated

    with monkeypatch.context() as patched:
        patched.setattr(WorkspaceSnapshot.objects, "update_or_create", killed)
        with pytest.raises(Killed):
            workspace_snapshot(schema="acme", run_id=run.id, visit=5, path=source)
    row = WorkspaceSnapshot.objects.get(run_id=run.id, visit=5)
    restored = tmp_path / "restored"
    restored.mkdir()
    workspace_restore(schema="acme", snapshot=row, path=restored)
    assert (restored / "f.txt").read_text() == "attempt 1"
    retaken = workspace_snapshot(schema="acme", run_id=run.id, visit=5, path=source)
    assert retaken.object_key != row.object_key
    objects = s3_client().list_objects_v2(Bucket=settings.S3_BUCKET,
                                          Prefix=f"tenants/acme/workspaces/{run.id}/")
    keys = [item["Key"] for item in objects.get("Contents", [])]
    assert retaken.object_key in keys and row.object_key not in keys  # superseded one deleted


# -- real workers ------------------------------------------------------------------------------

def wait_run(run_id, *, timeout=60, status=("succeeded", "failed")):
    def ended():
        run = Run.objects.get(id=run_id)
        return run if run.status in status else None

    return wait_for(ended, timeout=timeout, interval=0.1, what=f"run {run_id} to end")


def start_enqueued(steps, **input):
    return run_start(agent="sandboxed", input={"steps": steps, **input}).run


def test_killed_worker_mid_command_resumes_on_another_with_the_last_snapshot(
        in_acme, start_worker, monkeypatch):
    block = Path(settings.SANDBOX_WORKSPACE_ROOT) / f"block-{uuid.uuid4().hex}"
    block.touch()
    first = start_worker("sandbox-doomed")
    run = start_enqueued([
        ["echo one > a.txt"],
        [{"command": "ls; echo two > b.txt", "block_while": str(block)}],
    ])
    partial = run_dir(schema="acme", run_id=run.id) / "workspace" / "b.txt"
    wait_for(partial.exists, timeout=60, what="the second step's command to be mid-way")
    first.kill()  # kill -9, mid-command
    assert WorkspaceSnapshot.objects.filter(run_id=run.id).count() == 1
    block.unlink()
    # Until the lease watchdog exists, an operator's re-queue: clear the lease, ring the bell.
    Run.objects.filter(id=run.id).update(lease_owner="", lease_expires_at=None)
    # The successor has no local copy at all, as on another host (the session worker, if it
    # runs one, shares the dead worker's half-written copy: restored all the same).
    other_host = Path(f"{settings.SANDBOX_WORKSPACE_ROOT}-other-host")
    monkeypatch.setenv("SANDBOX_WORKSPACE_ROOT", str(other_host))
    start_worker("sandbox-successor")
    advance.delay(str(run.id))
    run = wait_run(run.id)
    assert run.status == "succeeded", run.error
    [[one], [two]] = run.result["results"]
    assert two["stdout"].split() == ["a.txt"]  # the snapshot of step 1; not the killed half
    assert WorkspaceSnapshot.objects.filter(run_id=run.id).count() == 2


def test_limits_under_a_real_worker_are_typed_results_and_it_keeps_serving(in_acme, worker):
    run = start_enqueued([[
        {"command": "bash -c 'bomb() { bomb & bomb; }; bomb'", "timeout": 5},
        "python3 -c 'x = bytearray(4 * 1024 ** 3)'",
        "head -c 200000000 /dev/zero > big",
        {"command": "while true; do :; done", "timeout": 2},
    ]])
    run = wait_run(run.id, timeout=120)
    assert run.status == "succeeded", run.error
    assert [r["limit"] for r in run.result["results"][0]] == \
        ["processes", "memory", "file_size", "timeout"]
    after = wait_run(start_enqueued([["echo still serving"]]).id)
    assert after.result["results"][0][0]["stdout"] == "still serving\n"


def test_two_tenants_runs_in_parallel_never_see_each_others_files(acme, globex, worker):
    root = Path(settings.SANDBOX_WORKSPACE_ROOT)
    probe = (f"cat {root}/*/*/workspace/secret.txt 2>/dev/null; ls -A /workspace; "
             "cat secret.txt; grep -rl -e acme-secret -e globex-secret /workspace /tmp /etc /dev "
             "2>/dev/null; true")
    runs = {}
    for tenant in (acme, globex):
        with tenant_context(tenant):
            runs[tenant.schema_name] = start_enqueued([
                [f"echo {tenant.schema_name}-secret > secret.txt; sleep 1"], [probe]]).id
    for schema, run_id in runs.items():
        with tenant_context(acme if schema == "acme" else globex):
            run = wait_run(run_id)
            assert run.status == "succeeded", run.error
            seen = run.result["results"][1][0]["stdout"]
            other = "globex" if schema == "acme" else "acme"
            assert f"{schema}-secret" in seen and f"{other}-secret" not in seen, seen
    connection.set_schema_to_public()


def test_an_unreachable_store_fails_the_step_without_naming_the_internal_endpoint(
        in_acme, s3, acme_api, caplog):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        down = f"127.0.0.1:{probe.getsockname()[1]}"  # closed once the probe is
    run = sandboxed([["echo x > a.txt"]])
    working, settings.S3_ENDPOINT_URL = settings.S3_ENDPOINT_URL, f"http://{down}"
    try:
        with caplog.at_level("WARNING", logger="sandboxes.services"):
            run = finished(run.id)
    finally:
        settings.S3_ENDPOINT_URL = working
    assert run.status == "failed"
    assert run.error == ("step 'work' raised SandboxError: the workspace store is unavailable; "
                         "try again later")
    events = acme_api.get(f"/api/v1/runs/{run.id}/events").json()["results"]
    assert [e["kind"] for e in events].count("step_error") == 3
    assert down not in json.dumps(events) and "endpoint" not in json.dumps(events)
    assert down in caplog.text  # the operators' log has the detail
