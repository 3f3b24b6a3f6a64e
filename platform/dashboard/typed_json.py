"""JSON a person typed into a dashboard form (a run's input, an event's payload, an edited
artifact), read by the API's rules (agentplatform.parsers): no NaN or Infinity, no number too
large for a double, no U+0000 or lone surrogate in a string (PostgreSQL cannot store them: a
500 at the insert), and no nesting deeper than API_JSON_MAX_DEPTH (Python's parser recurses:
a RecursionError, a 500). What it refuses is a ValidationError in words, shown by the field.

And JSON a page shows (`json_shown`): what a run stored may nest deeper than the API takes (a
step passes a model's output on), deep enough that json.dumps, called inside the template's
own stack, recurses past the interpreter's limit; such a value is shown as a sentence."""

import json
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError

from agentplatform.storable import json_shape


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def json_typed(text: str) -> Any:
    """The value of `text`, or ValidationError saying why it is not JSON the platform keeps."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"Not valid JSON: {exc.msg} (line {exc.lineno}, column "
                              f"{exc.colno}).") from None
    except ValueError as exc:  # NaN, Infinity, -Infinity
        raise ValidationError(f"Not valid JSON: {exc}.") from None
    except RecursionError:
        raise ValidationError(_too_deep()) from None
    depth, unstorable = json_shape(value)
    if depth > settings.API_JSON_MAX_DEPTH:
        raise ValidationError(_too_deep())
    if unstorable:
        raise ValidationError(unstorable)
    return value


def _too_deep() -> str:
    return f"The JSON is nested deeper than {settings.API_JSON_MAX_DEPTH} levels."


TOO_DEEP_TO_SHOW = "(nested too deeply to show)"


def json_shown(value: Any, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """`value` as JSON text for a page, or TOO_DEEP_TO_SHOW (never a RecursionError)."""
    try:
        return json.dumps(value, indent=indent, sort_keys=sort_keys, default=str,
                          ensure_ascii=False)
    except RecursionError:
        return TOO_DEEP_TO_SHOW
