"""The steps picture: drawn by the real dot, embeddable inline, hostile step names kept text."""

import xml.etree.ElementTree as ET

import pytest

from dashboard import pictures
from dashboard.pictures import PictureError, steps_svg
from runs.agents import Agent, registry
from runs.transitions import finish

SVG = "{http://www.w3.org/2000/svg}"


def agent_of(name: str, steps: dict[str, list[str]], start: str) -> Agent:
    agent = Agent(name, version=1)
    registry.unregister(name, 1)  # drawn here only: not an agent of the platform
    for step, nexts in steps.items():
        agent.step(next=nexts, start=step == start, name=step)(lambda ctx, state: finish(None))
    return agent


@pytest.fixture
def loop():
    return agent_of("picture-loop", {"plan": ["work"], "work": ["work", "review"],
                                     "review": ["work", "done"], "done": []}, "plan")


def parsed(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # well-formed XML, no prolog needed


def nodes(root) -> dict[str, ET.Element]:
    """Each step's node by the name it shows (its first line of text)."""
    return {g.find(f"{SVG}text").text: g
            for g in root.iter(f"{SVG}g") if "step" in g.get("class", "").split()}


def test_every_step_is_a_node_and_every_declared_next_an_edge(loop):
    root = parsed(steps_svg(loop))
    assert set(nodes(root)) == {"plan", "work", "review", "done"}
    edges = [g for g in root.iter(f"{SVG}g") if "edge" in g.get("class", "").split()]
    titles = sorted("".join(g.find(f"{SVG}title").itertext()) for g in edges)
    assert titles == sorted(["plan->work", "work->work", "work->review", "review->work",
                             "review->done"])


def test_embeddable_with_an_accessible_name(loop):
    svg = steps_svg(loop, title="How it went")
    assert svg.startswith("<svg") and "<?xml" not in svg and "DOCTYPE" not in svg
    root = parsed(svg)
    assert root.get("role") == "img"
    title = root.find(f"{SVG}title")
    assert root.get("aria-labelledby") == title.get("id")
    assert title.text.startswith("How it went. Steps of picture-loop version 1: 4 steps")


def test_a_run_colours_by_status_and_says_it_in_words(loop):
    svg = steps_svg(loop, visits={"plan": 1, "work": 3, "review": 2}, current="work",
                    statuses={"plan": "done", "review": "done"},
                    path=[("plan", "work"), ("work", "work"), ("work", "review"),
                          ("review", "work")])
    by_name = nodes(parsed(svg))
    assert "status-current" in by_name["work"].get("class")
    assert "status-done" in by_name["plan"].get("class")
    assert "status-unvisited" in by_name["done"].get("class")
    work_text = " ".join(t.text for t in by_name["work"].iter(f"{SVG}text"))
    assert "running now" in work_text and "×3" in work_text
    assert "not visited" in " ".join(t.text for t in by_name["done"].iter(f"{SVG}text"))
    fill = by_name["work"].find(f"{SVG}path")  # a rounded box is a path
    assert fill.get("fill").lower() == pictures.STATUSES["current"][0]
    taken = [g for g in parsed(svg).iter(f"{SVG}g") if "taken" in g.get("class", "").split()]
    assert {"".join(g.find(f"{SVG}title").itertext()) for g in taken} == {
        "plan->work", "work->work", "work->review", "review->work"}
    assert "path taken: plan → work → work → review → work" in svg


def test_a_hostile_step_name_stays_text():
    hostile = '<script>alert("x")</script>'
    agent = agent_of("picture-hostile", {"go": [hostile, "\\N<b>&amp;"], hostile: [],
                                         "\\N<b>&amp;": []}, "go")
    svg = steps_svg(agent, statuses={hostile: "failed"})
    assert "<script" not in svg and "<b>" not in svg
    root = parsed(svg)
    assert {e.tag for e in root.iter()} <= {SVG + t for t in pictures._SVG_ELEMENTS}
    by_name = nodes(root)
    assert hostile in by_name and "\\N<b>&amp;" in by_name  # the text itself, not an escape
    texts = [t.text for t in by_name[hostile].iter(f"{SVG}text")]
    assert texts[0] == hostile


def test_two_pictures_on_one_page_share_no_ids(loop):
    first, second = parsed(steps_svg(loop)), parsed(steps_svg(loop))
    ids = lambda root: {e.get("id") for e in root.iter() if e.get("id")}  # noqa: E731
    assert ids(first) and not ids(first) & ids(second)


def test_a_dot_that_fails_is_a_picture_error(loop, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(PictureError):
        steps_svg(loop)

