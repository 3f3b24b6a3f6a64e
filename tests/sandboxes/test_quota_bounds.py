"""The workspace quota cannot be outgrown by a call: a call that starts over it is refused, no
file outgrows what is left of it (RLIMIT_FSIZE, which fallocate obeys too)."""

import os
import uuid

import pytest

from sandboxes.jail import SandboxError, sandbox_execute, workspace_usage
from tests.sandboxes.test_jail import tight, workspace

MiB = 1024 * 1024

FALLOC = """
import os
for i in range(100):
    fd = os.open(f'f{i}_TAG', os.O_CREAT | os.O_WRONLY)
    os.posix_fallocate(fd, 0, 64 * 1024 * 1024)
    os.close(fd)
"""


def test_a_call_that_starts_over_quota_is_refused_and_runs_nothing():
    ws = workspace()
    assert sandbox_execute(workspace=ws, command="head -c 6000000 /dev/zero > big",
                           limits=tight(workspace_bytes=32 * MiB)).ok
    with pytest.raises(SandboxError, match="over its quota"):
        sandbox_execute(workspace=ws, command="touch ran", limits=tight(workspace_bytes=4 * MiB))
    assert not (ws / "ran").exists()
    with pytest.raises(SandboxError, match="over its quota"):  # files the call brings count too
        sandbox_execute(workspace=ws, command="touch ran", files={"more": b"x" * (27 * MiB)},
                        limits=tight(workspace_bytes=32 * MiB))
    assert not (ws / "ran").exists()


def test_fallocate_cannot_overshoot_the_quota_and_the_quota_never_grows():
    ws = workspace()
    limits = tight(workspace_bytes=8 * MiB, file_size_bytes=64 * MiB)
    for _ in range(3):
        try:
            sandbox_execute(workspace=ws, limits=limits, command=[
                "python3", "-c", FALLOC.replace("TAG", uuid.uuid4().hex[:6])])
        except SandboxError:
            pass  # over quota from an earlier call: refused
        used, _ = workspace_usage(ws)
        assert used <= 8 * MiB, used  # was 6.4 GB after the first call, more after each


def test_a_remaining_quota_caps_each_file_written_in_the_jail():
    ws = workspace()
    assert sandbox_execute(workspace=ws, command="head -c 3000000 /dev/zero > a",
                           limits=tight(workspace_bytes=4 * MiB)).ok
    result = sandbox_execute(workspace=ws, command="head -c 3000000 /dev/zero > b",
                             limits=tight(workspace_bytes=4 * MiB))
    assert result.limit == "file_size", result
    assert os.stat(ws / "b").st_size <= 4 * MiB - 3000000
