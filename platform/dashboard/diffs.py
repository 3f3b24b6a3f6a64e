"""What changed between two JSON documents (a run's state at two checkpoints): every key added,
removed or changed, with its path, for the Run page's checkpoint diff."""

import re
from dataclasses import dataclass
from typing import Any

PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
MISSING = object()


@dataclass(frozen=True)
class Change:
    path: str  # e.g. `state.employee.email`, `logs.messages[3]`, `state["odd key"]`
    kind: str  # added, removed, changed
    before: Any = None
    after: Any = None


def _key_path(path: str, key: str) -> str:
    if PLAIN_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f'{path}["{key}"]'


def json_diff(before: Any, after: Any, path: str = "") -> list[Change]:
    """The changes from `before` to `after`, depth first, keys in sorted order. Objects are
    compared key by key and lists item by item (a longer list has items added, a shorter one
    removed); any other difference (a value, or a type) is one change at its path."""
    if isinstance(before, dict) and isinstance(after, dict):
        changes = []
        for key in sorted(set(before) | set(after), key=str):
            here = _key_path(path, str(key))
            old, new = before.get(key, MISSING), after.get(key, MISSING)
            if old is MISSING:
                changes.append(Change(here, "added", after=new))
            elif new is MISSING:
                changes.append(Change(here, "removed", before=old))
            else:
                changes += json_diff(old, new, here)
        return changes
    if isinstance(before, list) and isinstance(after, list):
        changes = []
        for index in range(max(len(before), len(after))):
            here = f"{path}[{index}]"
            if index >= len(before):
                changes.append(Change(here, "added", after=after[index]))
            elif index >= len(after):
                changes.append(Change(here, "removed", before=before[index]))
            else:
                changes += json_diff(before[index], after[index], here)
        return changes
    # 1 == 1.0 == True in Python; in JSON a number is not a boolean
    if before == after and type(before) is type(after):
        return []
    return [Change(path or "(whole document)", "changed", before=before, after=after)]
