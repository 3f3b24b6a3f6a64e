"""Template filters of the Run page: times as <time> elements, JSON shown readably."""

from django import template
from django.utils.html import format_html

from ..typed_json import json_shown

register = template.Library()


@register.filter
def at(value):
    """A datetime as `<time datetime=...>2026-12-01 20:31:05 UTC</time>`; blank for none."""
    if not value:
        return ""
    return format_html('<time datetime="{}">{} UTC</time>', value.isoformat(),
                       value.strftime("%Y-%m-%d %H:%M:%S"))


@register.filter
def pretty_json(value) -> str:
    return json_shown(value, indent=2, sort_keys=True)


@register.filter
def json_line(value, limit: int = 120) -> str:
    text = json_shown(value)
    return text if len(text) <= limit else text[: limit - 2] + " …"


@register.filter
def get_item(mapping, key):
    return mapping.get(key, "")
