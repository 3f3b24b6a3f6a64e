"""A jail cannot leave the host a way in: the workspace root goes back to 0700 and set-id bits
are cleared after every call, so a binary owned by the jail's host uid is no setuid door."""

import os
import stat
import subprocess

from sandboxes.jail import sandbox_execute
from tests.sandboxes.test_jail import tight, workspace


def test_a_setuid_binary_and_an_opened_workspace_do_not_survive_the_call():
    ws = workspace()
    result = sandbox_execute(
        workspace=ws, limits=tight(),
        command="mkdir -p sub && cp /usr/bin/id s && cp /usr/bin/id sub/g && chmod 4755 s && "
                "chmod 2755 sub/g && chmod 755 /workspace")
    assert result.ok, result
    assert stat.S_IMODE(os.stat(ws).st_mode) == 0o700
    for name in ("s", "sub/g"):
        mode = os.stat(ws / name).st_mode
        assert not mode & (stat.S_ISUID | stat.S_ISGID), (name, oct(mode))
    ran = subprocess.run(["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups", "sh",
                          "-c", 'exec "$0"', str(ws / "s")], capture_output=True, text=True)
    assert "euid=" not in ran.stdout and ran.returncode != 0, ran  # another host user: no way in
