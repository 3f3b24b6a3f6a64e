"""Walking and removing directory trees a tenant built, however deep, without recursion.

A jail can nest directories thousands deep: os.walk and shutil.rmtree (Python 3.11) recurse once
per level and raise RecursionError, and a path longer than PATH_MAX cannot even be named. These
work relative to directory file descriptors, with an explicit stack, and never follow a link.

`tree_walk` holds one descriptor per level, so it takes a depth limit. `tree_remove` holds at
most REMOVE_OPEN_DIRS descriptors: a directory found deeper is moved up beside the top one
(same filesystem, one rename) and removed from there.
"""

import os
import stat
from collections.abc import Iterator
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
REMOVE_OPEN_DIRS = 32


class TreeTooDeep(OSError):
    """A directory of the tree is nested deeper than the walk's depth limit."""


def _listing(fd: int) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of each entry of the directory open at `fd`; entries that vanish are left."""
    found = []
    with os.scandir(fd) as entries:  # scandir dups the descriptor, and closes its copy
        for entry in entries:
            try:
                found.append((entry.name, entry.stat(follow_symlinks=False)))
            except OSError:
                continue
    return found


def tree_walk(root: Path, *, max_depth: int, too_deep: list[str] | None = None,
              ) -> Iterator[tuple[str, os.stat_result, int, str]]:
    """(relative path, lstat, parent directory fd, name) of every entry below `root`, top-down.
    The fd is valid only until the next item. A directory with entries more than `max_depth`
    levels down raises TreeTooDeep, or, given a `too_deep` list, is appended to it and not
    entered. A directory that cannot be opened is skipped."""
    stack = [(os.open(root, _DIR_FLAGS), "", None)]
    try:
        while stack:
            fd, prefix, pending = stack[-1]
            if pending is None:
                try:
                    pending = iter(_listing(fd))
                except OSError:
                    pending = iter(())
                stack[-1] = (fd, prefix, pending)
            item = next(pending, None)
            if item is None:
                os.close(stack.pop()[0])
                continue
            name, info = item
            rel = prefix + name
            yield rel, info, fd, name
            if not stat.S_ISDIR(info.st_mode):
                continue
            if len(stack) >= max_depth:
                if too_deep is None:
                    raise TreeTooDeep(f"{root}: directories nested more than {max_depth} deep")
                too_deep.append(rel)
                continue
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue
            stack.append((child, rel + "/", None))
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _open_dir(name: str, parent: int) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except PermissionError:  # a tenant's chmod 000; the worker owns or may chmod it
        os.chmod(name, 0o700, dir_fd=parent)
        return os.open(name, _DIR_FLAGS, dir_fd=parent)


def tree_remove(path: Path) -> None:
    """Remove `path` and everything below it, bottom-up, never following a link; a missing
    path is fine."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(path)
        return
    top = os.open(path, _DIR_FLAGS)
    if os.geteuid() != 0:
        os.fchmod(top, 0o700)
    stack: list[tuple[int, str, list | None]] = [(top, "", None)]
    moved = 0
    try:
        while stack:
            fd, name, pending = stack[-1]
            if not pending:
                pending = _listing(fd)  # again once emptied: what was moved up lands at the top
                if not pending:
                    stack.pop()
                    if fd != top:
                        os.close(fd)
                        os.rmdir(name, dir_fd=stack[-1][0])
                    continue
                stack[-1] = (fd, name, pending)
            entry, info = pending.pop()
            if not stat.S_ISDIR(info.st_mode):
                try:
                    os.unlink(entry, dir_fd=fd)
                except FileNotFoundError:
                    pass
                continue
            if len(stack) >= REMOVE_OPEN_DIRS:  # too deep to hold open: move it up to the top
                moved += 1
                os.rename(entry, f".ap-deep-{os.getpid()}-{moved}", src_dir_fd=fd,
                          dst_dir_fd=top)
                continue
            child = _open_dir(entry, fd)
            if os.geteuid() != 0:
                os.fchmod(child, 0o700)
            stack.append((child, entry, None))
    finally:
        for fd, _, _ in stack:
            if fd != top:
                os.close(fd)
        os.close(top)
    os.rmdir(path)
