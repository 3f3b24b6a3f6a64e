"""The steps picture: an agent's steps and edges laid out by Graphviz' dot, as inline SVG.

The graph is built with the `graphviz` package (quoting) and drawn by Debian's `dot` binary
under a timeout. One function, `steps_svg`, used by the run page (this run's path, visits and
current step) and the agents page (the bare topology). Step names are the operator's code but
are treated as text: they reach dot through `_text` (no backslash escapes, no HTML-like
labels, no entities) and dot writes them into the SVG XML-escaped; the result is checked to
hold no element the picture does not draw. Colour is never the only signal: each node's label
also says its status in words.
"""

import re
import subprocess
import uuid
from html import escape as html_escape

import graphviz
from django.utils.safestring import SafeString, mark_safe

# How long dot may take before the picture is given up (a broken or hung dot must not hang a
# request); an agent's few dozen steps lay out in milliseconds.
DOT_TIMEOUT_SECONDS = 5

# status -> (fill colour, border colour, the words shown in the node)
STATUSES = {
    "done": ("#d9f2e3", "#1a7f45", "done"),
    "current": ("#dbe9ff", "#1d5fd1", "running now"),
    "waiting": ("#fff1cc", "#9a6700", "waiting"),
    "failed": ("#ffe0e0", "#b42318", "failed"),
    "unvisited": ("#ffffff", "#6b7280", "not visited"),
}

# What dot's SVG may contain; anything else means something got through as markup.
_SVG_ELEMENTS = {"svg", "g", "title", "polygon", "ellipse", "path", "text", "polyline", "a",
                 "defs", "desc"}


class PictureError(RuntimeError):
    """dot failed or took too long: the page shows the steps as a list instead."""


def steps_svg(agent, *, visits: dict[str, int] | None = None, current: str | None = None,
              statuses: dict[str, str] | None = None, path: list[tuple[str, str]] | None = None,
              title: str = "") -> SafeString:
    """The agent's steps (nodes) and declared next steps (edges), as SVG markup safe to embed.

    visits: how often this run visited each step ("×3" in the label).
    current: the step the run is at (status "current" unless `statuses` says otherwise).
    statuses: per step, one of STATUSES; steps not named are "unvisited" when a run is shown
    (visits, statuses or path given), and plain when only the topology is drawn.
    path: the edges this run took, as (from, to) pairs of consecutive steps: drawn bold.
    title: the picture's accessible name (a description of what it shows is added).
    Raises PictureError if dot fails or exceeds DOT_TIMEOUT_SECONDS."""
    visits = visits or {}
    statuses = dict(statuses or {})
    if current and current not in statuses:
        statuses[current] = "current"
    for_a_run = bool(visits or statuses or path)
    taken = set(path or ())
    prefix = f"steps-{uuid.uuid4().hex[:8]}"  # ids unique on a page holding several pictures

    graph = graphviz.Digraph(name=_text(f"{agent.name} v{agent.version}"), graph_attr={
        "rankdir": "TB", "id": prefix, "bgcolor": "transparent", "nodesep": "0.4",
        "fontname": "sans-serif"},
        node_attr={"shape": "box", "style": "rounded,filled", "fontname": "sans-serif",
                   "fontsize": "12", "fillcolor": "#ffffff", "color": "#6b7280"},
        edge_attr={"color": "#6b7280", "arrowsize": "0.7"})
    names = sorted(agent.steps)
    ids = {name: f"{prefix}-n{i}" for i, name in enumerate(names)}
    for name in names:
        status = statuses.get(name, "unvisited") if for_a_run else None
        lines = [name]
        detail = []
        if status:
            detail.append(STATUSES[status][2])
        if visits.get(name):
            detail.append(f"×{visits[name]}")
        if name == agent.start:
            detail.insert(0, "start")
        if detail:
            lines.append(" · ".join(detail))
        attrs = {"id": ids[name], "class": f"step status-{status or 'plain'}",
                 "label": _text("\n".join(lines))}
        if status:
            fill, border, _ = STATUSES[status]
            attrs.update(fillcolor=fill, color=border)
            if status == "unvisited":
                attrs["style"] = "rounded,filled,dashed"
            if status in ("current", "failed", "waiting"):
                attrs["penwidth"] = "2"
        if name == agent.start:
            attrs["peripheries"] = "2"
        graph.node(_text(name), **attrs)
    edge_count = 0
    for name in names:
        for to in sorted(agent.steps[name].next):
            bold = (name, to) in taken
            attrs = {"id": f"{prefix}-e{edge_count}", "class": "taken" if bold else ""}
            if bold:
                attrs.update(penwidth="3", color="#111827")
            graph.edge(_text(name), _text(to), **attrs)
            edge_count += 1

    # graphviz' own pipe() has no timeout (0.21): its source goes to dot here, with one.
    try:
        svg = subprocess.run(["dot", "-Tsvg"], input=graph.source, capture_output=True,
                             text=True, encoding="utf-8", check=True,
                             timeout=DOT_TIMEOUT_SECONDS).stdout
    except (OSError, subprocess.SubprocessError) as exc:  # missing, failed or too slow
        raise PictureError(f"dot could not draw the steps of {agent.name}: {exc}") from exc

    description = _describe(agent, statuses=statuses, current=current, path=path or [])
    name = f"{title}. {description}" if title else description
    return mark_safe(_embeddable(svg, prefix=prefix, name=name))


def _text(text: str) -> str:
    """A name or label for dot, shown as written: no backslash escapes (\\N, \\G), no HTML-like
    label, and `&` spelled `&amp;` (dot passes an entity such as `&amp;` through unescaped)."""
    return graphviz.escape(text.replace("&", "&amp;"))


def _describe(agent, *, statuses: dict[str, str], current: str | None,
              path: list[tuple[str, str]]) -> str:
    words = [f"Steps of {agent.name} version {agent.version}: {len(agent.steps)} steps, "
             f"starting at {agent.start}"]
    if current:
        words.append(f"now at {current}")
    failed = sorted(step for step, status in statuses.items() if status == "failed")
    if failed:
        words.append(f"failed at {', '.join(failed)}")
    if path:
        route = [path[0][0], *(to for _, to in path)]
        words.append(f"path taken: {' → '.join(route)}")
    return "; ".join(words) + "."


def _embeddable(svg: str, *, prefix: str, name: str) -> str:
    """dot's SVG without its XML prolog, doctype and comments, with an accessible name."""
    start = svg.find("<svg")
    if start < 0:
        raise PictureError("dot wrote no <svg> element")
    svg = re.sub(r"<!--.*?-->", "", svg[start:], flags=re.S).strip()
    tags = set(re.findall(r"<([A-Za-z][\w:-]*)", svg))
    if not tags <= _SVG_ELEMENTS:
        raise PictureError(f"unexpected elements in dot's SVG: {sorted(tags - _SVG_ELEMENTS)}")
    open_tag = re.match(r"<svg\b[^>]*>", svg).group(0)
    accessible = (open_tag[:-1] + f' role="img" aria-labelledby="{prefix}-title"'
                  f' class="steps-picture">'
                  f'<title id="{prefix}-title">{html_escape(name)}</title>')
    return accessible + svg[len(open_tag):]
