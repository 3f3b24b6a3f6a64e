"""How the API reads request bodies: JSON only (a form or multipart body is 415), and only JSON it
can keep. A body nested deeper than API_JSON_MAX_DEPTH is 400 `json_too_deep` (Python's parser
would recurse into a 500 first); a string holding U+0000 (`\\u0000`) is 400 `parse_error`, not a
500 at the insert (PostgreSQL's text and jsonb cannot hold it); so is a number too large for a
float (`1e400` reads as infinity; NaN and Infinity are refused by DRF's strict parser already)
and a lone surrogate (`\\ud800`: not a character, and not valid UTF-8 to store). It imports
no view module: DRF loads it while rest_framework.views is being imported."""

import math

from django.conf import settings
from rest_framework import exceptions, parsers


class JsonTooDeep(exceptions.ParseError):
    default_code = "json_too_deep"


class JsonParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:  # deeper than the interpreter's stack: far over any limit
            raise JsonTooDeep(_too_deep()) from None
        depth, unstorable = json_shape(data)
        if depth > settings.API_JSON_MAX_DEPTH:
            raise JsonTooDeep(_too_deep())
        if unstorable:
            raise exceptions.ParseError(unstorable)
        return data


def _too_deep() -> str:
    return f"The JSON body is nested deeper than {settings.API_JSON_MAX_DEPTH} levels."


NUL = "JSON strings may not contain U+0000 (\\u0000): it cannot be stored."
SURROGATE = ("JSON strings may not contain surrogate code points (\\ud800-\\udfff) that are not "
             "part of a pair: they are not characters.")
NOT_FINITE = "JSON numbers must be finite: this one is too large for a double."


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
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest, problem
