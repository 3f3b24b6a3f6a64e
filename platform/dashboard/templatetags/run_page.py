"""Template filters of the Run page: times as <time> elements, JSON shown readably."""

import json

from django import template
from django.utils.html import format_html

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
    return json.dumps(value, indent=2, default=str, ensure_ascii=False, sort_keys=True)


@register.filter
def json_line(value, limit: int = 120) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 2] + " …"


@register.filter
def get_item(mapping, key):
    return mapping.get(key, "")
