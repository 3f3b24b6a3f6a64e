"""Resource abuse from inside a jail: sparse and countless files, FIFOs left for the worker,
fork bombs and memory hogs spread over processes (the jail's cgroup), and what of the host a
jail can see (only the parts of /usr it needs; never the project or other runs' workspaces)."""

import hashlib
import io
import os
import shutil
import stat
import tarfile
import threading
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from agentplatform.s3 import s3_client
from runs.services import run_start
from sandboxes import jail
from sandboxes.cgroups import PREFIX, cgroup_dirs_of
from sandboxes.jail import SandboxError, SandboxUnavailable, sandbox_execute
from sandboxes.models import WorkspaceSnapshot
from sandboxes.services import (
    SandboxSession,
    snapshot_object_key,
    snapshot_seal,
    workspace_restore,
)
from tenants.services import data_key_get
from tests.sandboxes.test_jail import run, tight, workspace
from tests.support.waiting import wait_for

MiB = 1024 * 1024


def my_jail_cgroups() -> list[Path]:
    """Jail cgroups made by this process that still exist, in any hierarchy."""
    found = set()
    for directory in cgroup_dirs_of(os.getpid()).values():
        for base in (directory, directory.parent):
            found.update(base.glob(f"{PREFIX}{os.getpid()}-*"))
    return sorted(found)


def sandboxed_run():
    return run_start(agent="sandboxed", input={"steps": [["true"]]}, enqueue=False).run


# -- workspace size: apparent bytes and entries --------------------------------------------------

def test_sparse_files_count_their_apparent_size_against_the_workspace_quota():
    ws = workspace()
    result = run("for i in $(seq 1 20); do truncate -s 6M f$i; done", ws)  # each < RLIMIT_FSIZE
    assert result.limit == "disk", result
    assert sum(p.stat().st_blocks for p in ws.iterdir()) * 512 < MiB  # almost no blocks


def test_the_number_of_workspace_entries_is_capped():
    result = run("mkdir d; for i in $(seq 1 300); do : > d/f$i; done", max_files=100)
    assert result.limit == "files", result
    assert run("for i in $(seq 1 50); do : > f$i; done", max_files=100).limit is None


def test_a_workspace_over_its_quota_is_not_snapshotted(in_acme, s3, settings):
    settings.SANDBOX_WORKSPACE_MAX_BYTES = 32 * MiB
    run_row = sandboxed_run()
    session = SandboxSession(run_id=run_row.id, visit=0)
    result = session.run("for i in $(seq 1 20); do truncate -s 30M f$i; done")  # each under the quota
    assert result.limit == "disk", result
    scratch = Path(settings.SANDBOX_WORKSPACE_ROOT) / ".tmp"
    with pytest.raises(SandboxError, match="over its quota"):
        session.step_completed()  # refused before compressing 1.2 GB of holes
    assert not WorkspaceSnapshot.objects.filter(run=run_row).exists()
    assert not scratch.exists() or list(scratch.iterdir()) == []


def upload_snapshot(acme, run_row, members) -> WorkspaceSnapshot:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    version, key = data_key_get(tenant=acme)
    blob = snapshot_seal(buffer.getvalue(), key=key, schema="acme", run_id=run_row.id, visit=0)
    object_key = snapshot_object_key(schema="acme", run_id=run_row.id, visit=0)
    s3_client().put_object(Bucket=settings.S3_BUCKET, Key=object_key, Body=blob)
    return WorkspaceSnapshot.objects.create(
        run=run_row, visit=0, object_key=object_key, key_version=version, size_bytes=len(blob),
        file_count=len(members), sha256=hashlib.sha256(blob).hexdigest())


def member(name: str, *, size: int = 0, type=tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.linkname, info.mode = size, type, linkname, 0o644
    return info


def test_restore_refuses_a_snapshot_whose_members_exceed_the_quota(in_acme, acme, s3, settings):
    settings.SANDBOX_WORKSPACE_MAX_BYTES = 32 * MiB
    run_row = sandboxed_run()
    snapshot = upload_snapshot(acme, run_row, [(member("zeros", size=40 * MiB),
                                                bytes(40 * MiB))])  # 40 KiB compressed
    target = workspace()
    with pytest.raises(SandboxError, match="more than"):
        workspace_restore(schema="acme", snapshot=snapshot, path=target)
    assert list(target.iterdir()) == []


def test_restore_leaves_out_special_files_hard_links_traversal_and_links_out(in_acme, acme, s3):
    run_row = sandboxed_run()
    escape = f"escape-{uuid.uuid4().hex}.txt"
    snapshot = upload_snapshot(acme, run_row, [
        (member("ok.txt", size=2), b"ok"),
        (member("inside", type=tarfile.SYMTYPE, linkname="ok.txt"), None),
        (member("pipe", type=tarfile.FIFOTYPE), None),
        (member("hard", type=tarfile.LNKTYPE, linkname="ok.txt"), None),
        (member(f"../{escape}", size=1), b"x"),
        (member("passwd", type=tarfile.SYMTYPE, linkname="/etc/passwd"), None),
        (member("up", type=tarfile.SYMTYPE, linkname="../../.."), None),
    ])
    target = workspace()
    workspace_restore(schema="acme", snapshot=snapshot, path=target)
    assert sorted(p.name for p in target.iterdir()) == ["inside", "ok.txt"]
    assert (target / "inside").read_text() == "ok"
    assert not (target.parent / escape).exists()


# -- FIFOs, sockets and devices the jail leaves behind ------------------------------------------

def in_thread(call):
    """Run `call` in a thread; (done event, box with its result or exception)."""
    box, done = {}, threading.Event()

    def target():
        try:
            box["value"] = call()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, daemon=True).start()
    return done, box


def unblock(fifo: Path) -> None:
    """Open the FIFO from both ends at once, so a worker blocked on it (main's bug) goes on."""
    try:
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        os.write(fd, b"x")
        os.close(fd)
    except OSError:
        pass


def test_a_fifo_in_the_workspace_never_hangs_the_worker(in_acme, s3):
    session = SandboxSession(run_id=sandboxed_run().id, visit=0)
    made = session.run("mkfifo out.txt in.txt && python3 -c \"import socket; "
                       "socket.socket(socket.AF_UNIX).bind('sock')\" && echo ok > real.txt")
    assert made.exit_code == 0, made
    fifo = session.local.path / "out.txt"
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    calls = {
        "read a FIFO": lambda: session.read("out.txt"),
        "read a socket": lambda: session.read("sock"),
        "write onto a FIFO": lambda: sandbox_execute(  # a thread has no tenant: the jail alone
            workspace=session.local.path, command="cat in.txt", files={"in.txt": "data"},
            limits=tight()),
    }
    for what, call in calls.items():
        done, box = in_thread(call)
        try:
            wait_for(done.is_set, timeout=10, what=f"{what} to return")
        finally:
            unblock(fifo)
            unblock(session.local.path / "in.txt")
        assert isinstance(box.get("error"), SandboxError), (what, box)
        assert "not a regular file" in str(box["error"]) or "cannot be opened" in str(box["error"])
    assert session.read("real.txt") == b"ok\n"
    snapshot = session.step_completed()  # the snapshot leaves the specials out
    restored = workspace()
    workspace_restore(schema="acme", snapshot=snapshot, path=restored)
    assert sorted(p.name for p in restored.iterdir()) == ["real.txt"]


# -- the jail's cgroup: memory, pids, CPU -------------------------------------------------------

def jail_pid(marker: str) -> int | None:
    """The jail's own shell (not bwrap, nor the wrapper that starts it: their argv has it too)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(
                    b"/bin/sh\0-c\0" + marker.encode()):
                return int(pid)
        except OSError:
            pass
    return None


def test_each_jail_runs_in_a_cgroup_of_its_own_that_is_removed_after_it():
    ws, marker = workspace(), f": {uuid.uuid4().hex};"
    done, box = in_thread(lambda: run(f"{marker} while [ ! -e go ]; do sleep 0.05; done", ws,
                                      memory_bytes=300 * MiB, processes=20, cpus=0.5))
    pid = wait_for(lambda: jail_pid(marker), timeout=20, what="the jail's command")
    dirs = cgroup_dirs_of(pid)
    assert all(PREFIX in str(path) for path in dirs.values()), dirs
    mine = cgroup_dirs_of(os.getpid())
    # v1: below the worker's own group; v2: beside it (no processes in inner groups)
    assert all(dirs[c].parent in (mine[c], mine[c].parent) for c in dirs), (dirs, mine)
    if (dirs["memory"] / "memory.max").exists():  # cgroup v2
        assert (dirs["memory"] / "memory.max").read_text().strip() == str(300 * MiB)
        assert (dirs["pids"] / "pids.max").read_text().strip() == "20"
        assert (dirs["cpu"] / "cpu.max").read_text().split() == ["50000", "100000"]
    else:
        assert (dirs["memory"] / "memory.limit_in_bytes").read_text().strip() == str(300 * MiB)
        assert (dirs["pids"] / "pids.max").read_text().strip() == "20"
        assert (dirs["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "50000"
    (ws / "go").touch()
    wait_for(done.is_set, timeout=30, what="the jail to end")
    assert box["value"].exit_code == 0 and box["value"].limit is None, box
    assert not any(path.exists() for path in dirs.values())
    assert my_jail_cgroups() == []


SILENT_FORK_BOMB = """
import os, sys
os.close(2)
while True:
    try:
        os.fork()
    except OSError:
        pass
"""


def test_fork_bomb_that_hides_its_failures_is_stopped_by_the_pids_limit():
    result = run(["python3", "-c", SILENT_FORK_BOMB], timeout=30, processes=24)
    assert result.limit == "processes", result
    assert result.duration_ms < 30_000  # stopped by the limit, not by the wall clock
    assert my_jail_cgroups() == []


MEMORY_HOG = ("for i in 1 2 3 4; do python3 -c 'import time; x = b\"x\" * (100 * 2**20); "
              "time.sleep(20)' & done; wait")


def test_memory_hog_spread_over_processes_is_killed_by_the_memory_limit():
    result = run(MEMORY_HOG, timeout=60, memory_bytes=256 * MiB)  # each under its RLIMIT_AS
    assert result.limit == "memory", result
    assert result.duration_ms < 20_000  # killed, not slept out
    assert my_jail_cgroups() == []


def test_a_host_without_cgroups_refuses_jails_unless_the_operator_allows_it(settings):
    settings.SANDBOX_CGROUP_PARENT = f"/ap-missing-{uuid.uuid4().hex}"
    ws = workspace()
    with pytest.raises(SandboxUnavailable) as refused:
        sandbox_execute(workspace=ws, command="echo ran > ran.txt", limits=tight())
    assert "cgroup" in str(refused.value) and "SANDBOX_ALLOW_NO_CGROUPS" in str(refused.value)
    assert not (ws / "ran.txt").exists()
    settings.SANDBOX_ALLOW_NO_CGROUPS = True
    assert run("echo ran > ran.txt", ws).exit_code == 0
    bomb = run("bash -c 'bomb() { bomb & bomb; }; bomb'", timeout=5)
    assert bomb.limit == "processes", bomb  # RLIMIT_NPROC still binds
    assert my_jail_cgroups() == []


# -- what of the host a jail sees ---------------------------------------------------------------

def test_only_the_parts_of_usr_a_jail_needs_are_there():
    listing = run("ls /usr; echo --; ls /usr/share; echo --; ls -A /usr/local /usr/src 2>&1; "
                  "true")
    usr, share, elsewhere = (part.split() for part in listing.stdout.split("--\n"))
    assert "local" not in usr and "src" not in usr and "include" not in usr, usr
    assert set(usr) <= {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "libexec", "share"}
    assert set(share) <= {"zoneinfo", "ca-certificates", "misc"}, share
    assert "No such file or directory" in " ".join(elsewhere)
    tools = run(["python3", "-c", "import json, sqlite3, zoneinfo; "
                 "print(zoneinfo.ZoneInfo('Europe/Paris').key)"])
    assert tools.stdout == "Europe/Paris\n", tools
    assert run(["bash", "-c", "echo $((6 * 7))"]).stdout == "42\n"


@pytest.mark.parametrize("setting", ["SANDBOX_WORKSPACE_ROOT", "BASE_DIR"])
def test_a_project_or_workspace_root_a_jail_would_see_is_refused(setting, settings):
    visible = Path("/usr/lib") / f"ap-test-{uuid.uuid4().hex}"
    setattr(settings, setting, visible)
    try:
        with pytest.raises(SandboxUnavailable, match="would be visible inside every jail"):
            sandbox_execute(workspace=visible / "acme" / "run" / "workspace", command="true",
                            limits=tight())
    finally:
        shutil.rmtree(visible, ignore_errors=True)


def test_another_runs_workspace_is_neither_mounted_nor_readable(settings):
    root = Path("/usr/share") / f"ap-test-{uuid.uuid4().hex}"  # a part of /usr no jail gets
    settings.SANDBOX_WORKSPACE_ROOT = root
    try:
        theirs, mine = workspace("globex"), workspace("acme")
        assert run("echo globex-secret > secret.txt", theirs).exit_code == 0
        seen = run(f"cat {theirs}/secret.txt; ls -A {root} {theirs.parent}; "
                   "grep -rs globex-secret /usr /workspace /tmp; true", mine)
        assert "globex-secret" not in seen.stdout, seen
        assert stat.S_IMODE(theirs.stat().st_mode) == 0o700
        assert stat.S_IMODE(root.stat().st_mode) == 0o711
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_workspace_the_jail_gets_is_private_to_it():
    ws = Path(settings.SANDBOX_WORKSPACE_ROOT) / "acme" / str(uuid.uuid4()) / "workspace"
    assert run("echo mine > f.txt", ws).exit_code == 0
    info = ws.stat()
    assert stat.S_IMODE(info.st_mode) == 0o700
    assert info.st_uid == (jail.host_uid() if jail.host_uid() is not None else os.geteuid())
