"""The API's JSON parser: DRF's, refusing a body nested deeper than API_JSON_MAX_DEPTH with 400
`json_too_deep` (Python's parser would recurse into a 500 first). It imports no view module:
DRF loads it while rest_framework.views is being imported."""

from django.conf import settings
from rest_framework import exceptions, parsers


class JsonTooDeep(exceptions.ParseError):
    default_code = "json_too_deep"


class JsonParser(parsers.JSONParser):
    """DRF's JSON parser, refusing documents nested deeper than API_JSON_MAX_DEPTH."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:  # deeper than the interpreter's stack: far over any limit
            raise JsonTooDeep(self._message()) from None
        if json_depth(data) > settings.API_JSON_MAX_DEPTH:
            raise JsonTooDeep(self._message())
        return data

    @staticmethod
    def _message() -> str:
        return f"The JSON body is nested deeper than {settings.API_JSON_MAX_DEPTH} levels."


def json_depth(value) -> int:
    """How deeply arrays and objects nest in a parsed JSON value (a scalar is 0), without
    recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest
