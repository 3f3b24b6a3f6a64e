"""deploy/dev's `ensure_debs`: Debian packages are installed only when their command is missing
(bubblewrap for `bwrap`, chromium for the browser tests, graphviz for `dot`, pgbouncer), with one
`apt-get update` for all of them, non-interactively; nothing runs when all are present. The
function runs as it is in the script, against an apt-get that only records its calls."""

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ensure_debs(tmp_path, present: list[str]) -> list[str]:
    """Run ensure_debs with PATH holding only `present` (and a shell), and a recording apt-get."""
    script = (ROOT / "deploy" / "dev").read_text()
    function = re.search(r"^ensure_debs\(\) \{\n.*?^\}\n", script, re.M | re.S).group(0)
    bin_dir, calls = tmp_path / "bin", tmp_path / "apt-calls"
    bin_dir.mkdir()
    for name in ["bash", "id", *present]:
        (bin_dir / name).symlink_to(shutil.which(name) or "/bin/true")
    (bin_dir / "apt-get").write_text(
        f'#!/bin/bash\necho "DEBIAN_FRONTEND=$DEBIAN_FRONTEND apt-get $*" >>{calls}\n')
    (bin_dir / "apt-get").chmod(0o755)
    done = subprocess.run(
        [shutil.which("bash"), "-c", f'set -euo pipefail\nsay() {{ echo "$*" >&2; }}\n{function}'
         'if [[ "$(id -u)" != 0 ]]; then id() { echo 0; }; fi\nensure_debs'],
        env={"PATH": str(bin_dir)}, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return calls.read_text().splitlines() if calls.exists() else []


def test_nothing_is_installed_when_every_command_is_present(tmp_path):
    assert ensure_debs(tmp_path, ["bwrap", "chromium", "dot", "pgbouncer", "ip"]) == []


def test_missing_chromium_and_dot_are_installed_in_one_go(tmp_path):
    assert ensure_debs(tmp_path, ["bwrap", "pgbouncer", "ip"]) == [
        "DEBIAN_FRONTEND=noninteractive apt-get update -qq",
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium graphviz"]


def test_only_the_missing_package_is_installed(tmp_path):
    assert ensure_debs(tmp_path, ["chromium", "dot", "pgbouncer", "ip"])[-1] == (
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap")


def test_a_missing_pgbouncer_is_installed(tmp_path):
    assert ensure_debs(tmp_path, ["bwrap", "chromium", "dot", "ip"])[-1] == (
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer")


def test_a_missing_ip_is_installed_for_the_partition_bench(tmp_path):
    assert ensure_debs(tmp_path, ["bwrap", "chromium", "dot", "pgbouncer"])[-1] == (
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2")
