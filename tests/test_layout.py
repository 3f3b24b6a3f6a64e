"""The source layout: platform/ is a source root, never a package that shadows the standard library."""

import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_platform_is_the_standard_librarys_in_a_process_started_from_the_checkout():
    # botocore calls platform.python_version(): a package named platform would break S3 calls
    code = ("import platform, boto3, agentplatform; "
            "print(platform.__file__); print(agentplatform.__file__); print(platform.python_version())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    assert Path(out[0]).parent == Path(sysconfig.get_paths()["stdlib"])
    assert Path(out[1]).is_relative_to(ROOT / "platform" / "agentplatform")
    assert out[2] == ".".join(map(str, sys.version_info[:3]))


def test_platform_directory_is_not_a_package():
    assert (ROOT / "platform" / "agentplatform" / "__init__.py").exists()
    assert not (ROOT / "platform" / "__init__.py").exists()
