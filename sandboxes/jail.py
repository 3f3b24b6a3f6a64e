"""The bubblewrap jail: builds the bwrap command line, runs one command in it, types the outcome.

No Django models here: `sandbox_execute()` takes a workspace directory and returns a
`SandboxResult`, so the engine, the tests and `python -m bench sandbox` all drive it alike.

What a command sees: read-only /usr (and the /bin, /lib* links into it), a few files of /etc,
a fresh /proc and /dev, a size-capped tmpfs /tmp, and its run's workspace at /workspace. It runs
in new user, PID, IPC, UTS, cgroup and network namespaces (only a loopback of its own), as an
unprivileged uid, with no capabilities, a cleared environment, and rlimits set by `prlimit`
inside the jail (so RLIMIT_NPROC counts only the jail's own user namespace).
"""

import os
import selectors
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from django.conf import settings

from .egress import FORWARDER, JAIL_SOCKET, PROXY_PORT, EgressPolicy, EgressProxy

SANDBOX_UID = 1000  # the uid inside the jail; mapped to SANDBOX_HOST_UID (or the worker's uid)
WORKSPACE = "/workspace"
ETC_FILES = ("ld.so.cache", "localtime", "nsswitch.conf", "alternatives")


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot build its jail on this host; nothing was run."""


class SandboxError(RuntimeError):
    """A sandbox call that cannot be made as asked (bad arguments, a reused name)."""


class Limit(StrEnum):
    TIMEOUT = "timeout"
    CPU = "cpu"
    MEMORY = "memory"
    FILE_SIZE = "file_size"
    DISK = "disk"
    PROCESSES = "processes"
    OPEN_FILES = "open_files"


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
    replayed: bool = False  # True when returned from the record instead of run again

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit is None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- the host's ability to jail: probed once per process -------------------------------------

_probe: tuple[str, str] | None = None  # (bwrap path it was probed with, "" or the reason)


def host_uid() -> int | None:
    """The host uid bwrap runs as. A root worker never jails as root: RLIMIT_NPROC does not
    bind uid 0, and bwrap keeps capabilities for a root caller."""
    configured = settings.SANDBOX_HOST_UID
    if configured is not None and configured >= 0:
        return configured
    return 65534 if os.geteuid() == 0 else None


def sandbox_probe(*, refresh: bool = False) -> None:
    """Raise SandboxUnavailable unless bwrap can create the jail's namespaces on this host."""
    global _probe
    bwrap = settings.SANDBOX_BWRAP
    if refresh or _probe is None or _probe[0] != bwrap:
        _probe = (bwrap, _probe_reason(bwrap))
    if _probe[1]:
        raise SandboxUnavailable(_probe[1])


def _probe_reason(bwrap: str) -> str:
    root = Path(settings.SANDBOX_WORKSPACE_ROOT)
    root.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            _bwrap_argv(bwrap, workspace=None, limits=Limits.from_settings(), command=["true"]),
            env=_BWRAP_ENV, stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
            **_user_kwargs(),
        )
    except FileNotFoundError:
        return (f"bubblewrap is not installed: {bwrap!r} was not found (Debian: apt-get install "
                "bubblewrap; see deploy/sandbox-hosts.md)")
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap could not be started ({bwrap}): {exc}"
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


def _bwrap_argv(bwrap: str, *, workspace: Path | None, limits: Limits,
                command: list[str], egress_socket: Path | None = None) -> list[str]:
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
        "--ro-bind", "/usr", "/usr",
    ]
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
    argv += [
        "--", "/usr/bin/prlimit",
        f"--cpu={cpu}:{cpu + 1}",  # SIGXCPU first, SIGKILL a second later
        f"--as={limits.memory_bytes}", f"--nproc={limits.processes}",
        f"--nofile={limits.open_files}", f"--fsize={limits.file_size_bytes}", "--core=0",
        "--", *command,
    ]
    return argv


def _workspace_entries(workspace: Path):
    """(relative path, lstat) of every entry below `workspace`; symlinks are never followed."""
    stack = [workspace]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            yield os.path.relpath(entry.path, workspace), info
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))


def workspace_listing(workspace: Path) -> dict[str, tuple[int, int, int]]:
    """relative path -> (mode, size, mtime_ns) for every entry."""
    return {rel: (info.st_mode, info.st_size, info.st_mtime_ns)
            for rel, info in _workspace_entries(workspace)}


def workspace_bytes(workspace: Path) -> int:
    return sum(info.st_blocks * 512 for _, info in _workspace_entries(workspace))


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


def _limit_of(exit_code: int, stderr: str, *, timed_out: bool, disk_full: bool) -> str | None:
    if disk_full:
        return Limit.DISK
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
    with EgressProxy(egress, owner_uid=host_uid()) as socket_path:
        return _execute(workspace=workspace, command=command, limits=limits, files=files,
                        egress_socket=socket_path)


def _execute(*, workspace: Path, command: str | list[str], limits: Limits,
             files: dict[str, str | bytes] | None, egress_socket: Path | None = None,
             ) -> SandboxResult:
    sandbox_probe()
    argv = _command_argv(command)
    workspace.mkdir(parents=True, exist_ok=True)
    before = workspace_listing(workspace)
    if files:
        workspace_write(workspace, files, uid=host_uid())
    # Over quota means over the limit and grown by this command (a full workspace can still run).
    quota = max(limits.workspace_bytes, workspace_bytes(workspace))
    started = time.monotonic()
    process = subprocess.Popen(
        _bwrap_argv(settings.SANDBOX_BWRAP, workspace=workspace, limits=limits, command=argv,
                    egress_socket=egress_socket),
        env=_BWRAP_ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True, **_user_kwargs(),
    )
    outputs = {process.stdout: bytearray(), process.stderr: bytearray()}
    truncated = {process.stdout: False, process.stderr: False}
    timed_out = disk_full = False
    deadline = started + limits.timeout
    next_disk_check = started + DISK_CHECK_SECONDS
    with selectors.DefaultSelector() as selector:
        for stream in outputs:
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if now >= next_disk_check:
                next_disk_check = now + DISK_CHECK_SECONDS
                if workspace_bytes(workspace) > quota:
                    disk_full = True
                    break
            for key, _ in selector.select(timeout=min(deadline - now, DISK_CHECK_SECONDS)):
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
    if timed_out or disk_full:
        _kill_group(process)
    try:
        exit_code = process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process)
        exit_code = process.wait()
    for stream in outputs:
        stream.close()
    duration_ms = (time.monotonic() - started) * 1000
    if not disk_full and workspace_bytes(workspace) > quota:
        disk_full = True
    stdout = outputs[process.stdout].decode(errors="replace")
    stderr = outputs[process.stderr].decode(errors="replace")
    after = workspace_listing(workspace)
    return SandboxResult(
        exit_code=exit_code, stdout=stdout, stderr=stderr,
        limit=_limit_of(exit_code, stderr, timed_out=timed_out, disk_full=disk_full),
        stdout_truncated=truncated[process.stdout], stderr_truncated=truncated[process.stderr],
        changed_files=sorted(p for p, meta in after.items()
                             if before.get(p) != meta and not _is_dir(meta)),
        deleted_files=sorted(p for p in before.keys() - after.keys()),
        duration_ms=round(duration_ms, 3),
    )


def _is_dir(meta: tuple[int, int, int]) -> bool:
    return (meta[0] & 0o170000) == 0o040000


def _kill_group(process: subprocess.Popen) -> None:
    """Kill bwrap's process group; the jail's PID namespace dies with its init (--die-with-parent)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def workspace_write(workspace: Path, files: dict[str, str | bytes], *, uid: int | None) -> None:
    """Write `files` (relative paths) into the workspace, refusing paths that leave it."""
    root = workspace.resolve()
    for name, content in files.items():
        target = (root / name).resolve()
        if not target.is_relative_to(root) or target == root:
            raise SandboxError(f"file {name!r} is outside the workspace")
        # Resolve parents without following a symlink the jail may have planted.
        for parent in reversed(target.relative_to(root).parents[:-1]):
            if (root / parent).is_symlink():
                raise SandboxError(f"file {name!r} goes through a symlink")
        target.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    if uid is not None:
        workspace_chown(workspace, uid)


def workspace_chown(workspace: Path, uid: int) -> None:
    """Give the jail's host uid the workspace (when the worker is root and jails as another)."""
    if os.geteuid() != 0:
        return
    os.lchown(workspace, uid, uid)
    for directory, dirs, names in os.walk(workspace):
        for name in dirs + names:
            os.lchown(os.path.join(directory, name), uid, uid)
