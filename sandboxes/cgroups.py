"""Each jail's cgroup: memory, pids and CPU limits the kernel enforces on all of a jail's
processes together (rlimits only bind one process, or one uid), and the counters that say a
limit was hit.

cgroup v2 is used when the host's unified hierarchy offers the memory, pids and cpu
controllers; otherwise the v1 memory, pids and cpu hierarchies. A jail's group is
`ap-jail-<worker pid>-<hex>`, made under the base (SANDBOX_CGROUP_PARENT, default: the worker's
own cgroup in v1, its parent in v2, where the no-internal-processes rule forbids children of a
cgroup that holds the worker), and removed when the jail ends. Groups a killed worker left
behind are swept at the next probe. See docs/decisions/0014-sandbox-limits.md.
"""

import logging
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("sandboxes.cgroups")

CONTROLLERS = ("memory", "pids", "cpu")
PREFIX = "ap-jail-"
CPU_PERIOD_US = 100_000
EMPTY_TIMEOUT_SECONDS = 5.0


class CgroupUnavailable(RuntimeError):
    """This host gives the worker no cgroup in which to limit a jail; the reason says why."""


@dataclass(frozen=True)
class CgroupHost:
    """Where this worker makes jail groups: v2, one base directory; v1, one per controller."""

    version: int
    bases: dict[str, Path]  # controller -> base directory (v2: the same directory for all)


def _mounts(mountinfo: str) -> tuple[Path | None, dict[str, tuple[Path, str]]]:
    """(cgroup2 mount point, {v1 controller: (mount point, mounted root)})."""
    unified, v1 = None, {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        root, point = fields[3], Path(fields[4].replace("\\040", " "))
        fstype, options = fields[dash + 1], fields[dash + 3].split(",")
        if fstype == "cgroup2" and unified is None:
            unified = point
        elif fstype == "cgroup":
            for option in options:
                if option in CONTROLLERS:
                    v1.setdefault(option, (point, root))
    return unified, v1


def _own_paths(proc_cgroup: str) -> tuple[str | None, dict[str, str]]:
    """(this process's v2 path, {v1 controller: path}) from /proc/self/cgroup."""
    v2, v1 = None, {}
    for line in proc_cgroup.splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and controllers == "":
            v2 = path
        for controller in controllers.split(","):
            if controller in CONTROLLERS:
                v1[controller] = path
    return v2, v1


def _below(point: Path, mounted_root: str, path: str) -> Path | None:
    """The directory of cgroup `path` under a mount of the hierarchy's `mounted_root`."""
    root = mounted_root.rstrip("/")
    if root and not (path == root or path.startswith(root + "/")):
        return None
    return point / path[len(root):].lstrip("/")


def cgroup_host(*, parent: str = "") -> CgroupHost:
    """Find where jail groups go on this host; raise CgroupUnavailable with the reason."""
    try:
        unified, v1 = _mounts(Path("/proc/self/mountinfo").read_text())
        own_v2, own_v1 = _own_paths(Path("/proc/self/cgroup").read_text())
    except OSError as exc:
        raise CgroupUnavailable(f"cannot read this process's cgroups: {exc}") from exc
    reasons = []
    if unified is not None and own_v2 is not None:
        base = _below(unified, "/", parent or str(Path(own_v2).parent))
        offered = _read(base / "cgroup.controllers").split() if base else []
        if all(controller in offered for controller in CONTROLLERS):
            return _v2_ready(base)
        reasons.append(f"cgroup v2 at {base} offers {offered or 'no controllers'}, "
                       f"not all of {', '.join(CONTROLLERS)}")
    missing = [c for c in CONTROLLERS if c not in v1 or c not in own_v1]
    if missing:
        reasons.append(f"no cgroup v1 hierarchy for {', '.join(missing)}")
        raise CgroupUnavailable("; ".join(reasons))
    bases = {}
    for controller in CONTROLLERS:
        point, mounted_root = v1[controller]
        base = _below(point, mounted_root, parent or own_v1[controller])
        if base is None or not base.is_dir():
            raise CgroupUnavailable(f"cgroup v1 {controller}: base cgroup "
                                    f"{parent or own_v1[controller]!r} does not exist")
        if not os.access(base, os.W_OK):
            raise CgroupUnavailable(f"cgroup v1 {controller}: {base} is not writable by uid "
                                    f"{os.geteuid()}")
        bases[controller] = base
    return CgroupHost(version=1, bases=bases)


def cgroup_dirs_of(pid: int) -> dict[str, Path]:
    """controller -> the directory of the cgroup process `pid` is in (for operators and tests)."""
    unified, v1 = _mounts(Path("/proc/self/mountinfo").read_text())
    v2_path, v1_paths = _own_paths(Path(f"/proc/{pid}/cgroup").read_text())
    dirs = {}
    for controller in CONTROLLERS:
        if controller in v1 and controller in v1_paths:
            dirs[controller] = _below(*v1[controller], v1_paths[controller])
        elif unified is not None and v2_path is not None:
            dirs[controller] = _below(unified, "/", v2_path)
    return dirs


def _v2_ready(base: Path) -> CgroupHost:
    enabled = _read(base / "cgroup.subtree_control").split()
    wanted = [c for c in CONTROLLERS if c not in enabled]
    if wanted:
        try:
            (base / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
        except OSError as exc:
            raise CgroupUnavailable(
                f"cgroup v2: cannot enable {', '.join(wanted)} for children of {base} ({exc}); "
                "the base must be a delegated cgroup that holds no processes itself (systemd: "
                "Delegate=yes with DelegateSubgroup=, or set SANDBOX_CGROUP_PARENT)") from exc
    return CgroupHost(version=2, bases={c: base for c in CONTROLLERS})


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _counter(text: str, name: str) -> int:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class JailCgroup:
    """One jail's group (a directory per v1 hierarchy, one in v2): made with its limits, joined
    by the jail's first process before it execs bwrap, read for the limits hit, removed."""

    def __init__(self, host: CgroupHost, *, memory_bytes: int, processes: int, cpus: float):
        self.host = host
        self.name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.dirs = {c: base / self.name for c, base in host.bases.items()}
        self.memory_bytes, self.processes, self.cpus = memory_bytes, processes, cpus

    def create(self) -> "JailCgroup":
        try:
            for directory in dict.fromkeys(self.dirs.values()):
                directory.mkdir()
            quota = max(1000, int(self.cpus * CPU_PERIOD_US))
            if self.host.version == 2:
                group = self.dirs["memory"]
                (group / "memory.max").write_text(str(self.memory_bytes))
                if (group / "memory.swap.max").exists():
                    (group / "memory.swap.max").write_text("0")
                (group / "pids.max").write_text(str(self.processes))
                (group / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
            else:
                memory = self.dirs["memory"]
                (memory / "memory.limit_in_bytes").write_text(str(self.memory_bytes))
                if (memory / "memory.memsw.limit_in_bytes").exists():  # no escape into swap
                    (memory / "memory.memsw.limit_in_bytes").write_text(str(self.memory_bytes))
                (self.dirs["pids"] / "pids.max").write_text(str(self.processes))
                (self.dirs["cpu"] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                (self.dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(quota))
        except OSError as exc:
            self.remove()
            raise CgroupUnavailable(f"cannot make the jail's cgroup {self.name}: {exc}") from exc
        return self

    def add(self, pid: int) -> None:
        for directory in dict.fromkeys(self.dirs.values()):
            (directory / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        if self.host.version == 2:
            return _counter(_read(self.dirs["memory"] / "memory.events"), "oom_kill")
        return _counter(_read(self.dirs["memory"] / "memory.oom_control"), "oom_kill")

    def pids_refused(self) -> int:
        """Forks refused because the group was at pids.max."""
        return _counter(_read(self.dirs["pids"] / "pids.events"), "max")

    def cpu_ms(self) -> float | None:
        """CPU time the group's processes used, in ms (v2 cpu.stat; v1 cpuacct beside cpu), or
        None where the host does not account it."""
        if self.host.version == 2:
            text = _read(self.dirs["cpu"] / "cpu.stat")
            return _counter(text, "usage_usec") / 1000 if "usage_usec" in text else None
        raw = _read(self.dirs["cpu"] / "cpuacct.usage").strip()
        return int(raw) / 1e6 if raw.isdigit() else None

    def pids(self) -> list[int]:
        found = set()
        for directory in dict.fromkeys(self.dirs.values()):
            found.update(int(p) for p in _read(directory / "cgroup.procs").split() if p.isdigit())
        return sorted(found)

    def kill(self) -> None:
        """SIGKILL every process in the group (also ones that left bwrap's process group)."""
        kill_file = self.dirs["pids"] / "cgroup.kill"
        if self.host.version == 2 and kill_file.exists():
            try:
                kill_file.write_text("1")
                return
            except OSError:
                pass
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove(self) -> None:
        """Kill what is left, wait until the group is empty, and remove it."""
        deadline = time.monotonic() + EMPTY_TIMEOUT_SECONDS
        remaining = list(dict.fromkeys(self.dirs.values()))
        while remaining:
            self.kill()
            for directory in list(remaining):
                try:
                    directory.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as exc:  # EBUSY: a task is still being reaped
                    if time.monotonic() >= deadline:
                        logger.error("jail cgroup %s not removed: %s", directory, exc)
                        return
                    continue
                remaining.remove(directory)
            if remaining:
                time.sleep(0.02)


def cgroups_sweep(host: CgroupHost) -> None:
    """Remove the groups of jails whose worker died (kill -9) before it could; its jails died
    with it (bwrap --die-with-parent), so their groups are empty."""
    for base in dict.fromkeys(host.bases.values()):
        try:
            children = [p for p in base.iterdir() if p.name.startswith(PREFIX) and p.is_dir()]
        except OSError:
            continue
        for child in children:
            owner = child.name[len(PREFIX):].split("-", 1)[0]
            if not owner.isdigit() or _alive(int(owner)):
                continue
            try:  # only if empty: a worker in another PID namespace may share this base
                child.rmdir()
            except OSError:
                pass
