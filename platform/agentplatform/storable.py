"""What PostgreSQL can keep of a JSON value: jsonb and text refuse U+0000, a lone surrogate
(not a character, not valid UTF-8) and a number that is not finite, each a DataError at the
insert. The API's parser, the dashboard's JSON fields, webhooks and the engine ask here before
they store (`json_shape`, `json_dumped`), so what cannot be stored is refused in words."""

import json
import math
import re
from typing import Any

NUL = "JSON strings may not contain U+0000 (\\u0000): it cannot be stored."
SURROGATE = ("JSON strings may not contain surrogate code points (\\ud800-\\udfff) that are not "
             "part of a pair: they are not characters.")
# Deeper, a value dumped again further down the stack (Django's JSONField, psycopg) could pass
# the interpreter's recursion limit at the write: refused at the check, wherever it runs.
JSON_MAX_DEPTH = 512
TOO_DEEP = f"JSON may nest arrays and objects at most {JSON_MAX_DEPTH} levels deep."
_SUSPECT = re.compile(r"\\u(?:0000|d[89a-f])")  # U+0000, or a surrogate (of a pair, or lone)
NOT_FINITE = ("JSON numbers must be finite: NaN, Infinity and numbers too large for a double "
              "cannot be stored.")


def _string_problem(text: str) -> str | None:
    if "\x00" in text:
        return NUL
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # only a lone surrogate fails: a pair was decoded as one
            return SURROGATE
    return None


def json_shape(value) -> tuple[int, str | None]:
    """How deeply arrays and objects nest in a parsed JSON value (a scalar is 0), and why it
    cannot be stored, if it cannot: a string (a key or a value) holding U+0000 or a lone
    surrogate, or a number that is not finite; without recursion."""
    deepest, problem, stack = 0, None, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            problem = problem or _string_problem(item)
            continue
        if isinstance(item, float):
            problem = problem or (None if math.isfinite(item) else NOT_FINITE)
            continue
        if isinstance(item, dict):
            children = [*item.keys(), *item.values()]
        elif isinstance(item, list | tuple):  # json writes a tuple as an array
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest, problem


class Unstorable(ValueError):
    """Why a value cannot be stored as jsonb, in words."""


def json_dumped(value: Any, *, default=None) -> str:
    """`value` as compact JSON that jsonb keeps, or Unstorable: not JSON (a type json cannot
    dump, unless `default` turns it into one), nested deeper than JSON_MAX_DEPTH, not finite,
    or a string holding U+0000 or a lone surrogate. One dump in C; what it wrote is read back
    and walked only if it may hold one of those: an escape of U+0000 or of a surrogate (an
    emoji is written as a pair of them, which is fine), or more brackets than the depth limit.
    What is walked is the dump read back, so `default`'s text is checked too."""
    try:
        dumped = json.dumps(value, separators=(",", ":"), allow_nan=False, default=default)
    except RecursionError:
        raise Unstorable(TOO_DEEP) from None
    except ValueError as exc:
        raise Unstorable(NOT_FINITE if "float" in str(exc) else f"it is not JSON: {exc}") from None
    except TypeError as exc:
        raise Unstorable(f"it is not JSON: {exc}") from None
    if _SUSPECT.search(dumped) or dumped.count("[") + dumped.count("{") > JSON_MAX_DEPTH:
        try:
            depth, problem = json_shape(json.loads(dumped))
        except RecursionError:
            raise Unstorable(TOO_DEEP) from None
        if depth > JSON_MAX_DEPTH:
            raise Unstorable(TOO_DEEP)
        if problem:
            raise Unstorable(problem)
    return dumped


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # U+0000 and lone surrogates


# Kept this deep at most, leaving room for the levels a value is carried in (a step's result in
# its transition, an appended value in its log) within JSON_MAX_DEPTH.
KEPT_MAX_DEPTH = JSON_MAX_DEPTH - 16
TOO_DEEP_KEPT = f"(nested deeper than {KEPT_MAX_DEPTH} levels: not kept)"
CYCLE_KEPT = "(a value that contains itself: not kept)"


def json_storable(value: Any) -> Any:
    """`value` as jsonb can hold it, for what must be recorded whatever it holds (a receiver's
    answer, an error's text): U+0000 and each lone surrogate become U+FFFD, a number that is
    not finite its text ("nan", "inf"), what nests deeper than KEPT_MAX_DEPTH the text
    TOO_DEEP_KEPT and a container inside itself CYCLE_KEPT. Everything else is left as it is."""
    return _storable(value, 0, set())


def _storable(value: Any, depth: int, path: set[int]) -> Any:
    # One frame a level, no comprehension's: KEPT_MAX_DEPTH levels stay within the
    # interpreter's recursion limit. `path`: the containers above this one.
    if isinstance(value, str):
        return _UNSTORABLE.sub("\ufffd", value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if not isinstance(value, dict | list | tuple):
        return value
    if depth >= KEPT_MAX_DEPTH:
        return TOO_DEEP_KEPT
    if id(value) in path:
        return CYCLE_KEPT
    path.add(id(value))
    if isinstance(value, dict):
        kept: Any = {}
        for key, item in value.items():
            kept[_UNSTORABLE.sub("\ufffd", str(key))] = _storable(item, depth + 1, path)
    else:
        kept = []
        for item in value:
            kept.append(_storable(item, depth + 1, path))
    path.discard(id(value))
    return kept
