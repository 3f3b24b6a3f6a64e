"""The agents page: every registered agent, its versions (description, topology hash, the
steps picture) and this tenant's runs per version by status, so a person sees which old
versions still have runs draining before their code is removed.

Agents come from runs.agents.registry, as in the API's agent list; the counts are one grouped
query over runs.selectors.run_list in the tenant's schema. A version that has runs but is no
longer registered is shown too: its unfinished runs cannot go on.
"""

from collections import defaultdict
from dataclasses import dataclass, field

from django.db.models import Count
from django.http import Http404
from django.shortcuts import render
from django.urls import path

from runs.agents import Agent, registry
from runs.models import Run
from runs.selectors import run_list
from tenants.roles import READ

from ..access import tenant_page
from ..pictures import PictureError, steps_svg

STATUSES = list(Run.Status.values)
UNFINISHED = {Run.Status.QUEUED, Run.Status.RUNNING, Run.Status.WAITING}


@dataclass
class Version:
    name: str
    version: int
    agent: Agent | None  # None: runs exist, the code is no longer registered
    counts: dict[str, int] = field(default_factory=dict)
    newest: bool = False
    picture: str = ""
    picture_error: str = ""

    @property
    def by_status(self) -> list[tuple[str, int]]:
        return [(status, self.counts.get(status, 0)) for status in STATUSES]

    @property
    def unfinished(self) -> int:
        return sum(n for status, n in self.counts.items() if status in UNFINISHED)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def draining(self) -> bool:
        """Unfinished runs on a version that is not the newest: they finish on this code."""
        return not self.newest and self.unfinished > 0


def versions_by_agent() -> dict[str, list[Version]]:
    """Each agent's versions, newest first, with this tenant's run counts."""
    counts: dict[tuple[str, int], dict[str, int]] = defaultdict(dict)
    rows = (run_list().order_by().values("agent", "agent_version", "status")
            .annotate(n=Count("id")))
    for row in rows:
        counts[(row["agent"], row["agent_version"])][row["status"]] = row["n"]
    registered = {(a.name, a.version): a for a in registry.all()}
    agents: dict[str, list[Version]] = defaultdict(list)
    for key in sorted(registered.keys() | counts.keys(), key=lambda k: (k[0], -k[1])):
        agents[key[0]].append(Version(key[0], key[1], registered.get(key), counts.get(key, {})))
    for versions in agents.values():
        newest = next((v for v in versions if v.agent is not None), None)
        if newest:
            newest.newest = True
    return dict(sorted(agents.items()))


def with_picture(version: Version) -> Version:
    if version.agent is not None:
        try:
            version.picture = steps_svg(
                version.agent, title=f"{version.name} version {version.version}")
        except PictureError:  # the page still lists the steps in words
            version.picture_error = "The picture could not be drawn."
    return version


@tenant_page(READ)
def agents(request, tenant):
    listed = versions_by_agent()
    for versions in listed.values():
        for version in versions:
            if version.newest:
                with_picture(version)
    return render(request, "dashboard/agents/list.html", {
        "section": "agents", "agents": listed, "statuses": STATUSES, "tenant": tenant})


@tenant_page(READ)
def agent(request, tenant, name: str):
    versions = versions_by_agent().get(name)
    if not versions:
        raise Http404("No such agent.")
    return render(request, "dashboard/agents/detail.html", {
        "section": "agents", "name": name, "versions": [with_picture(v) for v in versions],
        "statuses": STATUSES, "tenant": tenant})


urlpatterns = [
    path("agents", agents, name="agents"),
    path("agents/<str:name>", agent, name="agent"),
]
