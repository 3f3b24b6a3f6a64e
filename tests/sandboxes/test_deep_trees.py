"""A jail that nests directories thousands deep: the call stops at the depth limit, the next
call is refused, and the worker can still reset (remove) the workspace; no host-side walk
recurses (os.walk and shutil.rmtree raised RecursionError at about a thousand levels)."""

import os
import uuid

import pytest

from sandboxes.jail import SandboxError, host_uid, sandbox_execute, workspace_write
from sandboxes.services import LocalWorkspace
from tests.sandboxes.test_jail import tight

NEST = ("python3 -c \"import os\nfor _ in range(N):\n os.mkdir('d'); os.chdir('d')\n"
        "open('f', 'w').close()\"")


def local_workspace() -> LocalWorkspace:
    local = LocalWorkspace(schema="acme", run_id=uuid.uuid4())
    local.reset()
    return local


def test_nesting_past_the_depth_limit_stops_the_call_and_refuses_the_next():
    local = local_workspace()
    result = sandbox_execute(workspace=local.path, command=NEST.replace("N", "1200"),
                             limits=tight(timeout=30))
    assert result.limit == "depth", result
    with pytest.raises(SandboxError, match="deep"):
        sandbox_execute(workspace=local.path, command="touch ran", limits=tight())
    with pytest.raises(SandboxError, match="deep"):
        workspace_write(local.path, {"x": "1"}, uid=host_uid() or os.getuid())
    assert not (local.path / "ran").exists()
    local.reset()  # removes the whole tree, bottom-up, without recursion
    assert os.listdir(local.path) == []

