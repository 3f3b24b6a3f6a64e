"""A symlink loop the jail left is the caller's SandboxError, not a RuntimeError of pathlib."""

import pytest

from sandboxes.jail import SandboxError, sandbox_execute, workspace_read, workspace_write
from tests.sandboxes.test_jail import tight, workspace


def test_reading_or_writing_through_a_symlink_loop_is_a_sandbox_error():
    ws = workspace()
    assert sandbox_execute(workspace=ws, command="ln -s b a; ln -s a b", limits=tight()).ok
    with pytest.raises(SandboxError):
        workspace_read(ws, "a", max_bytes=10)
    with pytest.raises(SandboxError):
        workspace_write(ws, {"a/x": "hi"}, uid=None)
