"""How the API reads request bodies: JSON only (a form or multipart body is 415), and only JSON it
can keep. A body nested deeper than API_JSON_MAX_DEPTH is 400 `json_too_deep` (Python's parser
would recurse into a 500 first); a string holding U+0000 (`\\u0000`) is 400 `parse_error`, not a
500 at the insert (PostgreSQL's text and jsonb cannot hold it); so is a number too large for a
float (`1e400` reads as infinity; NaN and Infinity are refused by DRF's strict parser already)
and a lone surrogate (`\\ud800`: not a character, and not valid UTF-8 to store). It imports
no view module: DRF loads it while rest_framework.views is being imported."""

from django.conf import settings
from rest_framework import exceptions, parsers

from .storable import json_shape


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
