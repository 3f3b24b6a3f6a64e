"""How the API reads request bodies: JSON only (a form or multipart body is 415), and only JSON it
can keep. A body nested deeper than API_JSON_MAX_DEPTH is 400 `json_too_deep` (Python's parser
would recurse into a 500 first); a string holding U+0000 (`\\u0000`) is 400 `parse_error`, not a
500 at the insert (PostgreSQL's text and jsonb cannot hold it). It imports no view module: DRF
loads it while rest_framework.views is being imported."""

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
        depth, holds_nul = json_shape(data)
        if depth > settings.API_JSON_MAX_DEPTH:
            raise JsonTooDeep(_too_deep())
        if holds_nul:
            raise exceptions.ParseError(
                "JSON strings may not contain U+0000 (\\u0000): it cannot be stored.")
        return data


def _too_deep() -> str:
    return f"The JSON body is nested deeper than {settings.API_JSON_MAX_DEPTH} levels."


def json_shape(value) -> tuple[int, bool]:
    """How deeply arrays and objects nest in a parsed JSON value (a scalar is 0), and whether any
    string in it (a key or a value) holds U+0000; without recursion."""
    deepest, holds_nul, stack = 0, False, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            holds_nul = holds_nul or "\x00" in item
            continue
        if isinstance(item, dict):
            children = [*item.keys(), *item.values()]
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest, holds_nul
