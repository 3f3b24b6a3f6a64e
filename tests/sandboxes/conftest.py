"""Sandbox tests kill workers mid-jail: remove the jail cgroups those workers left behind."""

import pytest

from sandboxes.cgroups import CgroupUnavailable, cgroup_host, cgroups_sweep


@pytest.fixture(scope="session", autouse=True)
def _sweep_jail_cgroups():
    yield
    try:
        cgroups_sweep(cgroup_host())
    except CgroupUnavailable:
        pass
