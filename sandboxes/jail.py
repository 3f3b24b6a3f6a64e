"""The bubblewrap jail: builds the bwrap command line, runs one command in it, types the outcome.

No Django models here: `sandbox_execute()` takes a workspace directory and returns a
`SandboxResult`, so the engine, the tests and `python -m bench sandbox` all drive it alike.

What a command sees: the parts of /usr it needs (SANDBOX_USR_DIRS, read-only; and the /bin,
/lib* links into it), a few files of /etc, a fresh /proc and /dev, a size-capped tmpfs /tmp, and
its run's workspace at /workspace. It runs in new user, PID, IPC, UTS, cgroup and network
namespaces (only a loopback of its own), as an unprivileged uid, with no capabilities, a cleared
environment, in a cgroup of its own (memory, pids, CPU: sandboxes/cgroups.py), and with rlimits
set by `prlimit` inside the jail. A host where the project or the workspace root would be
visible inside a jail, or that gives the worker no cgroups (unless SANDBOX_ALLOW_NO_CGROUPS),
refuses to run jails.

Host-side, workspace files are opened without following links and without blocking, and only
regular files are read or written: a FIFO, socket or device the jail leaves behind is refused.
"""

import logging
import os
import selectors
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from django.conf import settings

from agentplatform.trees import TreeTooDeep, tree_walk

from .cgroups import CgroupHost, CgroupUnavailable, JailCgroup, cgroup_host, cgroups_sweep
from .egress import FORWARDER, JAIL_SOCKET, PROXY_PORT, EgressPolicy, EgressProxy

logger = logging.getLogger("sandboxes.jail")

SANDBOX_UID = 1000  # the uid inside the jail; mapped to SANDBOX_HOST_UID (or the worker's uid)
WORKSPACE = "/workspace"
ETC_FILES = ("ld.so.cache", "localtime", "nsswitch.conf", "alternatives")


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot build its jail on this host; nothing was run."""


class SandboxError(RuntimeError):
    """A sandbox call that cannot be made as asked (bad arguments, a reused name)."""


class WorkspaceTooDeep(SandboxError):
    """The workspace nests directories deeper than SANDBOX_WORKSPACE_MAX_DEPTH."""


class Limit(StrEnum):
    TIMEOUT = "timeout"
    CPU = "cpu"
    MEMORY = "memory"
    FILE_SIZE = "file_size"
    DISK = "disk"
    PROCESSES = "processes"
    OPEN_FILES = "open_files"
    FILES = "files"
    DEPTH = "depth"


@dataclass(frozen=True)
class Limits:
    timeout: float
    cpu_seconds: int
    memory_bytes: int
    processes: int
    open_files: int
    file_size_bytes: int
    workspace_bytes: int
    tmp_bytes: int
    output_bytes: int
    max_files: int
    cpus: float
    max_depth: int

    @classmethod
    def from_settings(cls, **overrides) -> "Limits":
        values = {
            "timeout": settings.SANDBOX_TIMEOUT_SECONDS,
            "cpu_seconds": settings.SANDBOX_CPU_SECONDS,
            "memory_bytes": settings.SANDBOX_MEMORY_BYTES,
            "processes": settings.SANDBOX_PROCESSES,
            "open_files": settings.SANDBOX_OPEN_FILES,
            "file_size_bytes": settings.SANDBOX_FILE_SIZE_BYTES,
            "workspace_bytes": settings.SANDBOX_WORKSPACE_MAX_BYTES,
            "tmp_bytes": settings.SANDBOX_TMP_BYTES,
            "output_bytes": settings.SANDBOX_OUTPUT_MAX_BYTES,
            "max_files": settings.SANDBOX_WORKSPACE_MAX_FILES,
            "cpus": settings.SANDBOX_CPUS,
            "max_depth": settings.SANDBOX_WORKSPACE_MAX_DEPTH,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass
class SandboxResult:
    """What a sandboxed command did. `limit` names the limit that stopped it, if one did."""

    exit_code: int
    stdout: str
    stderr: str
    limit: str | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    changed_files: list[str] = field(default_factory=list)
    deleted_files: list[str] = field(default_factory=list)
    duration_ms: float = 0.0
    cpu_ms: float | None = None  # the jail's CPU time from its cgroup; None where not accounted
    replayed: bool = False  # True when returned from the record instead of run again

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit is None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- the host's ability to jail: probed once per process -------------------------------------

@dataclass(frozen=True)
class _Probe:
    key: tuple
    reason: str  # "" when the host can jail
    cgroups: CgroupHost | None  # None: rlimits only (SANDBOX_ALLOW_NO_CGROUPS)


_probe: _Probe | None = None


def host_uid() -> int | None:
    """The host uid bwrap runs as. A root worker never jails as root: RLIMIT_NPROC does not
    bind uid 0, and bwrap keeps capabilities for a root caller."""
    configured = settings.SANDBOX_HOST_UID
    if configured is not None and configured >= 0:
        return configured
    return 65534 if os.geteuid() == 0 else None


def _probe_key() -> tuple:
    return (settings.SANDBOX_BWRAP, str(settings.SANDBOX_WORKSPACE_ROOT), str(settings.BASE_DIR),
            tuple(settings.SANDBOX_USR_DIRS), settings.SANDBOX_CGROUP_PARENT,
            settings.SANDBOX_ALLOW_NO_CGROUPS)


def sandbox_probe(*, refresh: bool = False) -> CgroupHost | None:
    """Raise SandboxUnavailable unless this host can jail; return where jails' cgroups go
    (None: none, which only SANDBOX_ALLOW_NO_CGROUPS allows)."""
    global _probe
    key = _probe_key()
    if refresh or _probe is None or _probe.key != key:
        _probe = _Probe(key, *_probe_host())
    if _probe.reason:
        raise SandboxUnavailable(_probe.reason)
    return _probe.cgroups


def _probe_host() -> tuple[str, CgroupHost | None]:
    reason = _visibility_reason()
    if reason:
        return reason, None
    root = Path(settings.SANDBOX_WORKSPACE_ROOT)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o711)  # the jail's host uid passes through; nobody lists the runs
    try:
        cgroups = cgroup_host(parent=settings.SANDBOX_CGROUP_PARENT)
        cgroups_sweep(cgroups)
    except CgroupUnavailable as exc:
        if not settings.SANDBOX_ALLOW_NO_CGROUPS:
            return (f"sandboxes are unavailable on this host: no cgroup to limit a jail's memory, "
                    f"processes and CPU ({exc}). Jails without them are refused unless "
                    "SANDBOX_ALLOW_NO_CGROUPS=1 (see deploy/sandbox-hosts.md)"), None
        logger.warning("sandbox jails run without cgroup limits (SANDBOX_ALLOW_NO_CGROUPS): %s",
                       exc)
        cgroups = None
    return _probe_reason(settings.SANDBOX_BWRAP, cgroups), cgroups


def _bound_dirs() -> list[Path]:
    """The host directories bound into every jail."""
    dirs = [Path("/usr") / name for name in settings.SANDBOX_USR_DIRS]
    dirs += [Path("/") / name for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
             if not (Path("/") / name).is_symlink()]
    return [path for path in dirs if path.is_dir()]


def _visibility_reason() -> str:
    """Why a jail would see the project or other runs' workspaces, or "" if it would not."""
    hidden = {"the project directory": Path(settings.BASE_DIR),
              "SANDBOX_WORKSPACE_ROOT": Path(settings.SANDBOX_WORKSPACE_ROOT)}
    for source in _bound_dirs():
        real = source.resolve()
        for what, path in hidden.items():
            path = path.resolve()
            if path.is_relative_to(real) or real.is_relative_to(path):
                return (f"sandboxes are unavailable on this host: {what} ({path}) would be "
                        f"visible inside every jail through its bind of {source}; move it out of "
                        f"{real} or take {source} out of SANDBOX_USR_DIRS "
                        "(see deploy/sandbox-hosts.md)")
    return ""


def _probe_reason(bwrap: str, cgroups: CgroupHost | None) -> str:
    if shutil.which(bwrap, path=_BWRAP_ENV["PATH"]) is None:
        return (f"bubblewrap is not installed: {bwrap!r} was not found (Debian: apt-get install "
                "bubblewrap; see deploy/sandbox-hosts.md)")
    limits = Limits.from_settings()
    cgroup = None
    try:
        cgroup = _jail_cgroup(cgroups, limits)
        process = _start(_bwrap_argv(bwrap, workspace=None, limits=limits, command=["true"],
                                     cgroup=cgroup is not None),
                         cgroup=cgroup, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            _, stderr = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
        done = subprocess.CompletedProcess(process.args, process.returncode, b"", stderr)
    except CgroupUnavailable as exc:
        return f"sandboxes are unavailable on this host: {exc} (see deploy/sandbox-hosts.md)"
    except FileNotFoundError:
        return (f"bubblewrap is not installed: {bwrap!r} was not found (Debian: apt-get install "
                "bubblewrap; see deploy/sandbox-hosts.md)")
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap could not be started ({bwrap}): {exc}"
    finally:
        if cgroup is not None:
            cgroup.remove()
    if done.returncode == 0:
        return ""
    said = done.stderr.decode(errors="replace").strip()[-500:]
    lowered = said.lower()
    if "can't find source path" in lowered:
        return (f"sandboxes are unavailable on this host: bubblewrap (as host uid {host_uid()}) "
                f"cannot reach a path it mounts: {said}. SANDBOX_WORKSPACE_ROOT and its parents "
                "must be searchable by that uid (see deploy/sandbox-hosts.md)")
    if "user namespace" in lowered or "uid map" in lowered or "no permissions to creat" in lowered \
            or "operation not permitted" in lowered or "permission denied" in lowered:
        feature = ("unprivileged user namespaces (kernel: CONFIG_USER_NS; sysctls "
                   "user.max_user_namespaces > 0, kernel.unprivileged_userns_clone = 1 where it "
                   "exists, kernel.apparmor_restrict_unprivileged_userns = 0 or an AppArmor "
                   "profile for bwrap)")
    elif "network" in lowered or "loopback" in lowered or "rtm_newaddr" in lowered:
        feature = "network namespaces (CONFIG_NET_NS)"
    elif "pid" in lowered:
        feature = "PID namespaces (CONFIG_PID_NS)"
    else:
        feature = "the namespaces bubblewrap needs"
    return (f"sandboxes are unavailable on this host: bubblewrap cannot create its namespaces; "
            f"missing kernel feature: {feature}. bwrap said: {said or '(nothing)'} "
            "(see deploy/sandbox-hosts.md)")


# -- the jail ----------------------------------------------------------------------------------

# bwrap's own environment leaks into the jail through /proc/1/environ: give it nothing.
_BWRAP_ENV = {"PATH": "/usr/bin:/bin"}


def _user_kwargs() -> dict[str, Any]:
    uid = host_uid()
    return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}


def _passwd_files() -> tuple[Path, Path]:
    """A passwd and group naming only the jail's user, so tools that look themselves up work."""
    base = Path(settings.SANDBOX_WORKSPACE_ROOT) / ".etc"
    passwd, group = base / "passwd", base / "group"
    if not passwd.exists():
        base.mkdir(parents=True, exist_ok=True)
        passwd.write_text(f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:{WORKSPACE}:/bin/sh\n"
                          "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
        group.write_text(f"sandbox:x:{SANDBOX_UID}:\nnogroup:x:65534:\n")
        for path in (base, passwd, group):
            path.chmod(0o755 if path.is_dir() else 0o644)
    return passwd, group


def _jail_cgroup(cgroups: CgroupHost | None, limits: Limits) -> JailCgroup | None:
    if cgroups is None:
        return None
    return JailCgroup(cgroups, memory_bytes=limits.memory_bytes, processes=limits.processes,
                      cpus=limits.cpus).create()


# Run by the jail's first process (the worker's child): wait on stdin until the worker has put
# it in the jail's cgroup, then become bwrap; so nothing the jail forks is ever outside it.
_JOIN_THEN_EXEC = 'read -r go || exit 125; exec "$@" </dev/null'


def _start(argv: list[str], *, cgroup: JailCgroup | None, **popen) -> subprocess.Popen:
    """Start bwrap (as the jail's host uid), inside `cgroup` from its first instruction."""
    if cgroup is None:
        return subprocess.Popen(argv, env=_BWRAP_ENV, stdin=subprocess.DEVNULL, **popen,
                                **_user_kwargs())
    go_read, go_write = os.pipe()
    try:
        process = subprocess.Popen(["/bin/sh", "-c", _JOIN_THEN_EXEC, "ap-jail", *argv],
                                   env=_BWRAP_ENV, stdin=go_read, **popen, **_user_kwargs())
    except BaseException:
        os.close(go_write)
        raise
    finally:
        os.close(go_read)
    try:
        cgroup.add(process.pid)
        os.write(go_write, b"go\n")
    except OSError as exc:
        os.close(go_write)  # the shell reads EOF and exits without starting bwrap
        process.kill()
        process.communicate()
        raise CgroupUnavailable(f"cannot put the jail in its cgroup {cgroup.name}: {exc}") from exc
    os.close(go_write)
    return process


def _bwrap_argv(bwrap: str, *, workspace: Path | None, limits: Limits,
                command: list[str], egress_socket: Path | None = None,
                cgroup: bool = True) -> list[str]:
    passwd, group = _passwd_files()
    argv = [
        bwrap,
        "--unshare-all", "--unshare-user", "--disable-userns",  # net too: only its own loopback
        "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox",
        "--clearenv",
        "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
        "--setenv", "HOME", WORKSPACE, "--setenv", "TMPDIR", "/tmp",
        "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
    ]
    for name in settings.SANDBOX_USR_DIRS:  # not /usr/local, /usr/src, …: only what runs tools
        argv += ["--ro-bind-try", f"/usr/{name}", f"/usr/{name}"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            argv += ["--ro-bind", str(path), f"/{name}"]
    for name in ETC_FILES:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    argv += ["--ro-bind", str(passwd), "/etc/passwd", "--ro-bind", str(group), "/etc/group",
             "--proc", "/proc", "--dev", "/dev",
             "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"]
    if workspace is not None:
        argv += ["--bind", str(workspace), WORKSPACE, "--chdir", WORKSPACE]
    if egress_socket is not None:  # still no route out: only the proxy's socket comes in
        proxy = f"http://127.0.0.1:{PROXY_PORT}"
        argv += ["--bind", str(egress_socket), JAIL_SOCKET]
        for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
            argv += ["--setenv", name, proxy]
        command = ["/usr/bin/python3", "-I", "-S", "-c", FORWARDER, JAIL_SOCKET, *command]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]  # bwrap's own tmpfs root and /dev
    cpu = max(1, int(limits.cpu_seconds))
    # The cgroup's pids.max counts the whole jail; RLIMIT_NPROC (one uid's count) only without.
    nproc = [] if cgroup else [f"--nproc={limits.processes}"]
    argv += [
        "--", "/usr/bin/prlimit",
        f"--cpu={cpu}:{cpu + 1}",  # SIGXCPU first, SIGKILL a second later
        f"--as={limits.memory_bytes}", *nproc,
        f"--nofile={limits.open_files}", f"--fsize={limits.file_size_bytes}", "--core=0",
        "--", *command,
    ]
    return argv


def _workspace_entries(workspace: Path, *, max_depth: int | None = None,
                       too_deep: list[str] | None = None):
    """(relative path, lstat) of every entry below `workspace`; symlinks are never followed.
    fd-relative and without recursion (agentplatform.trees): a directory nested deeper than
    `max_depth` (default SANDBOX_WORKSPACE_MAX_DEPTH) raises WorkspaceTooDeep, or with a
    `too_deep` list is noted there and not entered."""
    depth = settings.SANDBOX_WORKSPACE_MAX_DEPTH if max_depth is None else max_depth
    try:
        for rel, info, _, _ in tree_walk(workspace, max_depth=depth, too_deep=too_deep):
            yield rel, info
    except TreeTooDeep as exc:
        raise WorkspaceTooDeep(f"the workspace nests directories more than {depth} deep, over "
                               "its quota (SANDBOX_WORKSPACE_MAX_DEPTH)") from exc


def workspace_listing(workspace: Path, *, max_depth: int | None = None,
                      ) -> dict[str, tuple[int, int, int]]:
    """relative path -> (mode, size, mtime_ns) for every entry (none below `max_depth`)."""
    return {rel: (info.st_mode, info.st_size, info.st_mtime_ns)
            for rel, info in _workspace_entries(workspace, max_depth=max_depth, too_deep=[])}


def workspace_usage(workspace: Path, *, max_files: int | None = None,
                    max_depth: int | None = None) -> tuple[int, int]:
    """(apparent bytes, entries) below `workspace`. Apparent: a sparse file counts its whole
    size, as a snapshot would have to hold it. Stops counting past `max_files` entries; raises
    WorkspaceTooDeep for directories nested deeper than `max_depth`."""
    size = count = 0
    for _, info in _workspace_entries(workspace, max_depth=max_depth):
        count += 1
        if not stat.S_ISDIR(info.st_mode):
            size += info.st_size
        if max_files is not None and count > max_files:
            break
    return size, count


def workspace_bytes(workspace: Path) -> int:
    return workspace_usage(workspace)[0]


def _command_argv(command: str | list[str]) -> list[str]:
    if isinstance(command, str):
        return ["/bin/sh", "-c", command]
    if not command or not all(isinstance(part, str) for part in command):
        raise SandboxError("command must be a shell string or a non-empty list of strings")
    return list(command)


DISK_CHECK_SECONDS = 0.1

# stderr phrases by which a command reports a limit it ran into (checked in this order).
_MARKERS = (
    (Limit.MEMORY, ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")),
    (Limit.PROCESSES, ("Resource temporarily unavailable", "fork: retry", "can't fork")),
    (Limit.FILE_SIZE, ("File too large", "File size limit exceeded")),
    (Limit.DISK, ("No space left on device", "Disk quota exceeded")),
    (Limit.OPEN_FILES, ("Too many open files",)),
)


def _limit_of(exit_code: int, stderr: str, *, timed_out: bool, disk_full: bool,
              too_many_files: bool = False, too_deep: bool = False, oom_killed: bool = False,
              pids_refused: bool = False) -> str | None:
    if disk_full:
        return Limit.DISK
    if too_many_files:
        return Limit.FILES
    if too_deep:
        return Limit.DEPTH
    if oom_killed:  # the cgroup's memory limit: the kernel killed a process of the jail
        return Limit.MEMORY
    if pids_refused:  # the cgroup refused a fork at pids.max, whatever the command said
        return Limit.PROCESSES
    if exit_code in (128 + signal.SIGXCPU, -signal.SIGXCPU):
        return Limit.CPU
    if exit_code in (128 + signal.SIGXFSZ, -signal.SIGXFSZ):
        return Limit.FILE_SIZE
    for limit, phrases in _MARKERS:  # said so even if it then exited 0 (a bomb's parent does)
        if any(phrase in stderr for phrase in phrases):
            return limit
    if timed_out:
        return Limit.TIMEOUT
    if exit_code in (128 + signal.SIGKILL, -signal.SIGKILL):
        return Limit.CPU  # the hard RLIMIT_CPU, one second after SIGXCPU was ignored
    return None


def sandbox_execute(*, workspace: Path, command: str | list[str], limits: Limits,
                    files: dict[str, str | bytes] | None = None,
                    egress: EgressPolicy | None = None) -> SandboxResult:
    """Run `command` jailed with `workspace` at /workspace. Never raises for what the command
    does; raises SandboxUnavailable (nothing ran) when the host cannot jail. With an `egress`
    policy that allows something, the jail reaches those hosts through a host-side proxy."""
    if egress is None or not egress.rules:
        return _execute(workspace=workspace, command=command, limits=limits, files=files)
    sandbox_probe()  # no proxy for a host that cannot jail
    with EgressProxy(egress, owner_uid=host_uid(),
                     max_connections=settings.SANDBOX_EGRESS_MAX_CONNECTIONS) as socket_path:
        return _execute(workspace=workspace, command=command, limits=limits, files=files,
                        egress_socket=socket_path)


def _workspace_prepare(workspace: Path) -> None:
    """The run's workspace: a directory only the jail's host uid can enter."""
    workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(workspace)
    if not stat.S_ISDIR(info.st_mode):
        raise SandboxError(f"workspace {workspace} is not a directory")
    os.chmod(workspace, 0o700)
    uid = host_uid()
    if uid is not None and os.geteuid() == 0 and info.st_uid != uid:
        os.lchown(workspace, uid, uid)


def _execute(*, workspace: Path, command: str | list[str], limits: Limits,
             files: dict[str, str | bytes] | None, egress_socket: Path | None = None,
             ) -> SandboxResult:
    cgroups = sandbox_probe()
    argv = _command_argv(command)
    _workspace_prepare(workspace)
    before = workspace_listing(workspace, max_depth=limits.max_depth)
    if files:
        workspace_write(workspace, files, uid=host_uid())
    # A call that starts over quota is refused: nothing runs, the quota never grows to fit.
    used_bytes, used_files = workspace_usage(workspace, max_files=limits.max_files,
                                             max_depth=limits.max_depth)  # or WorkspaceTooDeep
    if used_bytes > limits.workspace_bytes or used_files > limits.max_files:
        raise SandboxError(
            f"the workspace is over its quota ({used_bytes} bytes of {limits.workspace_bytes}, "
            f"{'more than ' if used_files > limits.max_files else ''}{used_files} entries of "
            f"{limits.max_files}); nothing was run")
    # No single file may outgrow what is left of the quota (RLIMIT_FSIZE; fallocate too).
    limits = replace(limits, file_size_bytes=min(limits.file_size_bytes,
                                                 limits.workspace_bytes - used_bytes))
    quota_bytes, quota_files = limits.workspace_bytes, limits.max_files
    try:
        cgroup = _jail_cgroup(cgroups, limits)
    except CgroupUnavailable as exc:
        raise SandboxUnavailable(str(exc)) from exc
    try:
        return _run(workspace=workspace, argv=argv, limits=limits, cgroup=cgroup, before=before,
                    quota=(quota_bytes, quota_files), egress_socket=egress_socket)
    finally:
        if cgroup is not None:
            cgroup.remove()
        _workspace_seal(workspace, max_depth=limits.max_depth)


_SET_ID = stat.S_ISUID | stat.S_ISGID


def _workspace_seal(workspace: Path, *, max_depth: int) -> None:
    """After a jail: the workspace root back to 0700, and no setuid or setgid bit left on a
    file (a binary owned by the jail's host uid would let any host user become that uid).
    Inside, the bind of /workspace is already nosuid (bwrap binds nosuid, nodev)."""
    os.chmod(workspace, 0o700, follow_symlinks=False)
    for _, info, parent, name in tree_walk(workspace, max_depth=max_depth, too_deep=[]):
        if stat.S_ISREG(info.st_mode) and info.st_mode & _SET_ID:
            try:  # a regular file (lstat) and the jail is gone: chmod cannot follow a link here
                os.chmod(name, stat.S_IMODE(info.st_mode) & ~_SET_ID, dir_fd=parent)
            except OSError:
                logger.warning("could not clear set-id bits of %s in %s", name, workspace)


def _run(*, workspace: Path, argv: list[str], limits: Limits, cgroup: JailCgroup | None,
         before: dict, quota: tuple[int, int], egress_socket: Path | None) -> SandboxResult:
    started = time.monotonic()
    try:
        process = _start(
            _bwrap_argv(settings.SANDBOX_BWRAP, workspace=workspace, limits=limits, command=argv,
                        egress_socket=egress_socket, cgroup=cgroup is not None),
            cgroup=cgroup, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except CgroupUnavailable as exc:
        raise SandboxUnavailable(str(exc)) from exc
    outputs = {process.stdout: bytearray(), process.stderr: bytearray()}
    truncated = {process.stdout: False, process.stderr: False}
    hit = {"timed_out": False, "disk_full": False, "too_many_files": False,
           "too_deep": False, "oom_killed": False, "pids_refused": False}

    def check() -> bool:
        """Mark the limits the jail has hit; True if it must be stopped."""
        try:
            size, count = workspace_usage(workspace, max_files=quota[1],
                                          max_depth=limits.max_depth)
        except WorkspaceTooDeep:
            hit["too_deep"] = True
        else:
            hit["disk_full"] = hit["disk_full"] or size > quota[0]
            hit["too_many_files"] = hit["too_many_files"] or count > quota[1]
        if cgroup is not None:
            hit["oom_killed"] = hit["oom_killed"] or cgroup.oom_kills() > 0
            hit["pids_refused"] = hit["pids_refused"] or cgroup.pids_refused() > 0
        return any(hit.values())

    deadline = started + limits.timeout
    next_check = started + DISK_CHECK_SECONDS
    stop = False
    with selectors.DefaultSelector() as selector:
        for stream in outputs:
            selector.register(stream, selectors.EVENT_READ)
        while True:  # until the jail exits: a command that closes its output is still checked
            now = time.monotonic()
            if now >= deadline:
                hit["timed_out"] = stop = True
                break
            if now >= next_check:
                next_check = now + DISK_CHECK_SECONDS
                if check():
                    stop = True
                    break
            wait = min(deadline - now, DISK_CHECK_SECONDS)
            if not selector.get_map():
                try:
                    process.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            for key, _ in selector.select(timeout=wait):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                kept = outputs[key.fileobj]
                room = limits.output_bytes - len(kept)
                if room > 0:
                    kept += chunk[:room]
                if len(chunk) > room:
                    truncated[key.fileobj] = True  # keep draining, so the command never blocks
    if stop:
        _kill_jail(process, cgroup)
    try:
        exit_code = process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        hit["timed_out"] = True
        _kill_jail(process, cgroup)
        exit_code = process.wait()
    for stream in outputs:
        stream.close()
    duration_ms = (time.monotonic() - started) * 1000
    # Only a cgroup sees the whole jail's CPU: bwrap's own rusage misses what it did not reap.
    cpu_ms = cgroup.cpu_ms() if cgroup is not None else None
    check()
    stdout, stderr = _text(outputs[process.stdout]), _text(outputs[process.stderr])
    after = workspace_listing(workspace, max_depth=limits.max_depth)
    return SandboxResult(
        exit_code=exit_code, stdout=stdout, stderr=stderr,
        limit=_limit_of(exit_code, stderr, **hit),
        stdout_truncated=truncated[process.stdout], stderr_truncated=truncated[process.stderr],
        changed_files=sorted(_name(p) for p, meta in after.items()
                             if before.get(p) != meta and not _is_dir(meta)),
        deleted_files=sorted(_name(p) for p in before.keys() - after.keys()),
        duration_ms=round(duration_ms, 3),
        cpu_ms=None if cpu_ms is None else round(cpu_ms, 3),
    )


def _text(output: bytes) -> str:
    """A command's output as text PostgreSQL stores: invalid UTF-8 and NUL become U+FFFD."""
    return output.decode(errors="replace").replace("\0", "\ufffd")


def _name(path: str) -> str:
    """A file name as text PostgreSQL stores: bytes that are not UTF-8 (os.fsdecode's
    surrogates) are written as \\xNN escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _is_dir(meta: tuple[int, int, int]) -> bool:
    return (meta[0] & 0o170000) == 0o040000


def _kill_jail(process: subprocess.Popen, cgroup: JailCgroup | None) -> None:
    """Kill bwrap's process group and everything in the jail's cgroup; the jail's PID namespace
    dies with its init (--die-with-parent)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if cgroup is not None:
        cgroup.kill()


def workspace_write(workspace: Path, files: dict[str, str | bytes], *, uid: int | None) -> None:
    """Write `files` (relative paths) into the workspace, refusing paths that leave it."""
    root = workspace.resolve()
    for name, content in files.items():
        target = _resolve(root / name, name=name)
        if not target.is_relative_to(root) or target == root:
            raise SandboxError(f"file {name!r} is outside the workspace")
        # Resolve parents without following a symlink the jail may have planted.
        for parent in reversed(target.relative_to(root).parents[:-1]):
            if (root / parent).is_symlink():
                raise SandboxError(f"file {name!r} goes through a symlink")
        target.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        fd = workspace_open(target, os.O_WRONLY | os.O_CREAT, name=name)
        with os.fdopen(fd, "wb") as out:
            os.ftruncate(fd, 0)  # only now: O_TRUNC would act before the file type is known
            out.write(data)
    if uid is not None:
        workspace_chown(workspace, uid)


def _resolve(path: Path, *, name: str) -> Path:
    """`path` with its links resolved; a link loop (RuntimeError in Python 3.11) is the
    caller's SandboxError, as is a path the host cannot resolve."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:
        raise SandboxError(f"{name!r} cannot be resolved in the workspace: "
                           f"{getattr(exc, 'strerror', None) or exc}") from exc


def workspace_open(path: Path, flags: int, *, name: str) -> int:
    """Open a workspace file host-side: never through a final symlink, never blocking (a FIFO
    the jail made would hang the worker), and only if it is a regular file."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:  # ELOOP: a symlink; ENXIO: a FIFO without reader or a socket
        raise SandboxError(f"{name!r} cannot be opened in the workspace: "
                           f"{exc.strerror or exc}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SandboxError(f"{name!r} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def workspace_read(workspace: Path, path: str, *, max_bytes: int) -> bytes:
    """A regular file of the workspace (at most `max_bytes` of it), refusing paths that leave it."""
    root = workspace.resolve()
    target = _resolve(root / path, name=path)
    if not target.is_relative_to(root):
        raise SandboxError(f"{path!r} is outside the workspace")
    fd = workspace_open(target, os.O_RDONLY, name=path)
    with os.fdopen(fd, "rb") as source:
        return source.read(max_bytes)


def workspace_chown(workspace: Path, uid: int) -> None:
    """Give the jail's host uid the workspace (when the worker is root and jails as another).
    fd-relative, never through a link; a workspace nested too deep raises WorkspaceTooDeep."""
    if os.geteuid() != 0:
        return
    os.lchown(workspace, uid, uid)
    for _, _, parent, name in tree_walk_workspace(workspace):
        os.chown(name, uid, uid, dir_fd=parent, follow_symlinks=False)


def tree_walk_workspace(workspace: Path):
    """agentplatform.trees.tree_walk of a workspace at SANDBOX_WORKSPACE_MAX_DEPTH."""
    depth = settings.SANDBOX_WORKSPACE_MAX_DEPTH
    try:
        yield from tree_walk(workspace, max_depth=depth)
    except TreeTooDeep as exc:
        raise WorkspaceTooDeep(f"the workspace nests directories more than {depth} deep, over "
                               "its quota (SANDBOX_WORKSPACE_MAX_DEPTH)") from exc
