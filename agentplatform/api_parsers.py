"""How the API reads request bodies: JSON only, and only JSON that PostgreSQL can store. A string
holding U+0000 (`\u0000`) is refused with 400 here, instead of failing as a 500 at the insert
(PostgreSQL's text and jsonb cannot hold it). Imports no app: rest_framework.views loads it."""

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


def _holds_nul(data) -> bool:
    pending = [data]  # iterative: the depth of a body is not this function's stack
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return True
        elif isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return False


class JsonBodyParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        data = super().parse(stream, media_type, parser_context)
        if _holds_nul(data):
            raise ParseError("JSON strings may not contain U+0000 (\\u0000): it cannot be stored.")
        return data
