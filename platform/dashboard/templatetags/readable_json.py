"""`{{ value|readable_json }}`: JSON as a person reads it, not as a blob.

An object is a definition list, a list of objects with common keys a table, any other list a
list, nested to MAX_DEPTH (deeper values are shown as compact JSON); long lists are cut with a
count of what was left out. Every key and value is escaped: the artifact is an agent's output
(and through it, whatever the agent read), so it is text, never markup.
"""

from django import template
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from ..typed_json import json_shown

register = template.Library()

MAX_DEPTH = 4
MAX_ITEMS = 100  # per list or object shown; the rest is counted
MAX_COLUMNS = 8  # a list of objects with more distinct keys than this is a list, not a table


@register.filter
def readable_json(value) -> SafeString:
    return _render(value, 0)


@register.filter
def pretty_json(value) -> str:
    """Indented JSON (for the raw view and the editor); escaped by the template as usual."""
    return json_shown(value, indent=2)


def _render(value, depth: int) -> SafeString:
    if isinstance(value, dict):
        return _object(value, depth)
    if isinstance(value, list):
        return _list(value, depth)
    return _scalar(value)


def _scalar(value) -> SafeString:
    if value is None:
        return mark_safe('<span class="json-null">null</span>')
    if isinstance(value, bool):
        return format_html('<span class="json-bool">{}</span>', "true" if value else "false")
    if isinstance(value, int | float):
        return format_html('<span class="json-number">{}</span>', value)
    if value == "":
        return mark_safe('<span class="json-empty">(empty text)</span>')
    return format_html('<span class="json-string">{}</span>', str(value))


def _too_deep(value) -> SafeString:
    return format_html('<code class="json-deep">{}</code>',
                       json_shown(value)[:2000])


def _more(left_out: int) -> SafeString:
    return format_html('<p class="json-more muted">… and {} more</p>', left_out)


def _object(value: dict, depth: int) -> SafeString:
    if not value:
        return mark_safe('<span class="json-empty">(empty object)</span>')
    if depth >= MAX_DEPTH:
        return _too_deep(value)
    items = list(value.items())
    rows = format_html_join("", "<dt>{}</dt><dd>{}</dd>",
                            ((str(k), _render(v, depth + 1)) for k, v in items[:MAX_ITEMS]))
    more = _more(len(items) - MAX_ITEMS) if len(items) > MAX_ITEMS else ""
    return format_html('<dl class="kv json-object">{}</dl>{}', rows, more)


def _columns(value: list) -> list[str] | None:
    """The table's columns if `value` is a list of objects sharing keys, else None."""
    if not value or not all(isinstance(item, dict) and item for item in value):
        return None
    columns: list[str] = []
    for item in value:
        columns.extend(k for k in item if k not in columns)
    shared = set(value[0]).intersection(*value[1:])
    if len(columns) > MAX_COLUMNS or not shared:
        return None
    return columns


def _list(value: list, depth: int) -> SafeString:
    if not value:
        return mark_safe('<span class="json-empty">(empty list)</span>')
    if depth >= MAX_DEPTH:
        return _too_deep(value)
    shown = value[:MAX_ITEMS]
    more = _more(len(value) - MAX_ITEMS) if len(value) > MAX_ITEMS else ""
    columns = _columns(shown)
    if columns:
        head = format_html_join("", '<th scope="col">{}</th>', ((c,) for c in columns))
        body = format_html_join("", "<tr>{}</tr>", (
            (format_html_join("", "<td>{}</td>", (
                (_render(item[c], depth + 1) if c in item else mark_safe(""),)
                for c in columns)),)
            for item in shown))
        return format_html('<div class="table-wrap json-table" tabindex="0" role="region" aria-label="Table">'
                           '<table><thead><tr>{}</tr></thead>'
                           '<tbody>{}</tbody></table></div>{}', head, body, more)
    items = format_html_join("", "<li>{}</li>", ((_render(v, depth + 1),) for v in shown))
    return format_html('<ul class="json-list">{}</ul>{}', items, more)

