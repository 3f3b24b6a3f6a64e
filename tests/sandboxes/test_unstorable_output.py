"""Output PostgreSQL would refuse (NUL in stdout or stderr, a file name that is not UTF-8) is
stored sanitized, so the call is recorded and the run goes on instead of retrying forever."""

import pytest

from sandboxes.models import SandboxExecution
from sandboxes.services import SandboxSession
from tests.sandboxes.test_sandbox_runs import finished, sandboxed


@pytest.mark.parametrize("command, check", [
    ("printf 'a\\0b'; printf 'c\\0d' >&2",
     lambda r: r.stdout == "a\ufffdb" and r.stderr == "c\ufffdd"),
    ("touch \"$(printf 'x\\377')\"", lambda r: r.changed_files == ["x\\xff"]),
])
def test_output_the_database_would_refuse_is_recorded_sanitized(in_acme, s3, command, check):
    run = sandboxed([["true"]])
    session = SandboxSession(run_id=run.id, visit=0)
    result = session.run(command)
    assert check(result), result
    row = SandboxExecution.objects.get(run_id=run.id, name="sandbox-1")
    assert (row.stdout, row.stderr, row.changed_files) == (
        result.stdout, result.stderr, result.changed_files)


def test_a_run_whose_command_prints_nul_and_names_a_file_in_latin1_finishes(in_acme, s3):
    run = sandboxed([["printf 'a\\0b'; touch \"$(printf 'x\\377')\""], ["rm -f x*; echo next"]])
    run = finished(run.id)
    assert run.status == "succeeded", run.error
    [[first], [second]] = run.result["results"]
    assert first["stdout"] == "a\ufffdb"
    assert second["stdout"].strip() == "next"
