"""The jail itself: what a command inside cannot reach, and the limits that stop it."""

import os
import stat
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from sandboxes import jail
from sandboxes.jail import Limits, SandboxUnavailable, sandbox_execute
from sandboxes.services import LocalWorkspace
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def workspace(schema: str = "acme") -> Path:
    local = LocalWorkspace(schema=schema, run_id=uuid.uuid4())
    local.reset()
    return local.path


def tight(**overrides) -> Limits:
    values = {"timeout": 10, "cpu_seconds": 2, "memory_bytes": 512 * 1024 * 1024, "processes": 32,
              "file_size_bytes": 8 * 1024 * 1024, "workspace_bytes": 32 * 1024 * 1024,
              "tmp_bytes": 8 * 1024 * 1024, "output_bytes": 16 * 1024}
    return Limits.from_settings(**{**values, **overrides})


def run(command, ws: Path | None = None, **limits):
    return sandbox_execute(workspace=ws or workspace(), command=command, limits=tight(**limits))


PYTHON_CONNECT = """
import socket, sys
for host, port in [("127.0.0.1", 5432), ("127.0.0.1", 6379), ("127.0.0.1", {s3}), ("::1", 5432),
                   ("localhost", 5432)]:
    try:
        socket.create_connection((host, port), timeout=2).close()
        print("CONNECTED", host, port)
    except OSError as exc:
        print("refused", host, port, type(exc).__name__)
"""


def test_connecting_to_postgres_redis_s3_or_any_address_fails():
    result = run(["python3", "-c", PYTHON_CONNECT.replace("{s3}", str(settings.SEAWEEDFS_PORT))])
    assert result.exit_code == 0, result.stderr
    assert "CONNECTED" not in result.stdout and result.stdout.count("refused") == 5
    # No interface but its own loopback and no route anywhere: nothing can leave the host.
    interfaces = run("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").stdout.split()
    assert interfaces == ["lo"]
    assert run("tail -n +2 /proc/net/route").stdout.strip() == ""
    assert run("tail -n +2 /proc/net/if_inet6 | grep -v ' lo$' || true").stdout.strip() == ""


def test_project_source_root_home_and_host_dirs_are_not_there():
    for path in (ROOT, "/root", "/work", "/home", "/var", "/srv", "/opt", "/run", "/etc/shadow",
                 ROOT / "agentplatform" / "settings.py", ROOT / ".env"):
        result = run(f"ls -A {path} && cat {path}")
        assert result.exit_code != 0 and result.stdout == "", (path, result)
        assert "No such file or directory" in result.stderr
    assert sorted(run("ls /").stdout.split()) == [
        "bin", "dev", "etc", "lib", "lib64", "proc", "sbin", "tmp", "usr", "workspace"]


def test_worker_environment_and_secrets_are_not_visible():
    secrets = [os.environ["DATABASE_URL"], settings.MASTER_KEY, os.environ["DJANGO_SECRET_KEY"],
               os.environ["AWS_SECRET_ACCESS_KEY"]]
    result = run("env; for f in /proc/*/environ /proc/*/cmdline; do cat $f; echo; done; "
                 "cat /proc/1/environ")
    seen = result.stdout + result.stderr
    assert "DATABASE_URL" not in seen and "AGENTPLATFORM_MASTER_KEY" not in seen
    assert not any(secret in seen for secret in secrets)
    assert "SECRET" not in run("env").stdout


def test_another_tenants_workspace_cannot_be_read():
    theirs = workspace("globex")
    (theirs / "secret.txt").write_text("globex-secret")
    result = run(f"cat {theirs}/secret.txt 2>&1; ls {theirs.parent.parent} 2>&1; "
                 "cat /workspace/../globex/*/workspace/secret.txt 2>&1; "
                 "grep -r globex-secret / 2>/dev/null; true")
    assert "globex-secret" not in result.stdout


def test_writing_outside_the_workspace_fails_and_tmp_is_private():
    ws = workspace()
    result = run("for p in /usr/x /etc/x /x /bin/x /proc/x /dev/x /lib/x; do "
                 "(echo no > $p) 2>/dev/null && echo WROTE $p; done; echo yes > /tmp/t; "
                 "echo ok > /workspace/ok.txt; cat /tmp/t", ws)
    assert "WROTE" not in result.stdout and result.stdout.strip() == "yes"
    assert result.changed_files == ["ok.txt"] and (ws / "ok.txt").read_text() == "ok\n"
    assert run("ls -A /tmp", ws).stdout == ""  # a fresh tmpfs each time
    assert not Path("/usr/x").exists() and not Path("/x").exists()


def test_runs_as_an_unprivileged_user_without_capabilities():
    result = run("id -u; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; "
                 "unshare -U true 2>&1 && echo NESTED-USERNS; true")
    lines = result.stdout.split("\n")
    assert lines[0] == "1000"
    assert all(line.split()[1] == "0000000000000000" for line in lines[1:4]), result.stdout
    assert "NESTED-USERNS" not in result.stdout


def test_fork_bomb_is_stopped_by_the_process_limit():
    result = run("bash -c 'bomb() { bomb & bomb; }; bomb'", timeout=5)
    assert result.limit == "processes", result
    result = run(["python3", "-c", "import os\nwhile True: os.fork()"], timeout=5)
    assert result.limit == "processes", result


def test_memory_hog_is_stopped_by_the_memory_limit():
    result = run(["python3", "-c", "x = bytearray(2 * 1024 ** 3)"])
    assert result.limit == "memory" and result.exit_code != 0, result


def test_disk_fillers_are_stopped_by_file_size_and_workspace_limits():
    one_file = run("head -c 100000000 /dev/zero > big")
    assert one_file.limit == "file_size", one_file
    ws = workspace()
    many = run("i=0; while true; do head -c 4000000 /dev/zero > f$i; i=$((i+1)); done", ws)
    assert many.limit == "disk", many
    tmp = run("i=0; while true; do head -c 1000000 /dev/zero > /tmp/f$i || exit 1; "
              "i=$((i+1)); done")
    assert tmp.limit == "disk", tmp


def test_infinite_loop_is_stopped_by_the_cpu_limit():
    result = run(["python3", "-c", "while True: pass"], cpu_seconds=1)
    assert result.limit == "cpu", result
    assert result.duration_ms < 5000


def test_wall_clock_timeout_kills_every_process_of_the_jail():
    marker = f"{uuid.uuid4().int % 10**6}.25"
    result = run(f"(sleep {marker}) & sleep {marker}; echo never", timeout=1)
    assert result.limit == "timeout" and "never" not in result.stdout

    def sleepers():
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
            except OSError:
                pass
        return found

    wait_for(lambda: not sleepers(), timeout=5, what="the jail's processes to be gone")


def test_output_is_truncated_to_the_limit():
    result = run("yes | head -c 1000000; yes e | head -c 100000 >&2", output_bytes=1000)
    assert len(result.stdout) == 1000 and result.stdout_truncated
    assert len(result.stderr) == 1000 and result.stderr_truncated
    assert result.exit_code == 0 and result.limit is None


def test_files_are_written_into_the_workspace_and_reported_changed():
    ws = workspace()
    result = sandbox_execute(workspace=ws, command=["python3", "script.py"], limits=tight(),
                             files={"script.py": "open('out.txt', 'w').write('42')",
                                    "data/in.txt": "x"})
    assert result.exit_code == 0, result.stderr
    assert result.changed_files == ["data/in.txt", "out.txt", "script.py"]
    with pytest.raises(jail.SandboxError):
        sandbox_execute(workspace=ws, command="true", limits=tight(), files={"../escape": "x"})


FAKE_BWRAP = """#!/bin/sh
echo "$@" >> {log}
echo 'bwrap: No permissions to creating new namespace, likely because the kernel does not \
allow non-privileged user namespaces. On e.g. debian this can be enabled with \
'"'"'sysctl kernel.unprivileged_userns_clone=1'"'"'.' >&2
exit 1
"""


def test_without_user_namespaces_sandbox_calls_are_refused_and_nothing_runs():
    tmp_path = Path(settings.SANDBOX_WORKSPACE_ROOT) / f"fake-bwrap-{uuid.uuid4().hex}"
    tmp_path.mkdir()
    log = tmp_path / "invocations.log"
    fake = tmp_path / "bwrap"
    fake.write_text(FAKE_BWRAP.format(log=log))
    fake.chmod(0o755)
    tmp_path.chmod(0o755)
    log.touch()
    log.chmod(0o666)
    ws = workspace()
    original = settings.SANDBOX_BWRAP
    settings.SANDBOX_BWRAP = str(fake)
    try:
        for _ in range(2):
            with pytest.raises(SandboxUnavailable) as refused:
                sandbox_execute(workspace=ws, command="echo ran > ran.txt", limits=tight())
        assert "user namespaces" in str(refused.value)
        assert "deploy/sandbox-hosts.md" in str(refused.value)
    finally:
        settings.SANDBOX_BWRAP = original
        jail.sandbox_probe(refresh=True)
    assert not (ws / "ran.txt").exists()
    invocations = log.read_text().splitlines()
    assert len(invocations) == 1 and invocations[0].endswith("-- true")  # the probe, once
    assert stat.S_ISDIR(ws.stat().st_mode)
