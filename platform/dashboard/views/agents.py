"""The agents page: every agent this tenant can run, the platform's and its own
(registry.available(), `Agent.kind`), their versions (description, topology hash, the steps
picture) and this tenant's runs per version by status, so a person sees which old versions
still have runs draining before their code is removed.

Agents come from runs.agents.registry, as in the API's agent list; the counts are one grouped
query over runs.selectors.run_list in the tenant's schema. A version that has runs but is no
longer registered is shown too: its unfinished runs cannot go on. A tenant agent's own page
(its definition, versions and diffs) is views/definitions.py's.
"""

from collections import defaultdict
from dataclasses import dataclass, field

from django.db.models import Count
from django.http import Http404
from django.shortcuts import render
from django.urls import path

from runs.agents import Agent, registry
from runs.definitions.selectors import definition_versions, definitions_all
from runs.models import Run
from runs.selectors import run_list
from tenants.roles import READ

from ..access import tenant_page
from ..pictures import PictureError, steps_svg
from .definitions import definition_page

STATUSES = list(Run.Status.values)
UNFINISHED = {Run.Status.QUEUED, Run.Status.RUNNING, Run.Status.WAITING}


@dataclass
class Version:
    name: str
    version: int
    agent: Agent | None  # None: runs exist, the code is no longer registered
    counts: dict[str, int] = field(default_factory=dict)
    newest: bool = False
    retired: bool = False  # a tenant agent's version that starts no new runs
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
    def kind(self) -> str:
        return self.agent.kind if self.agent is not None else "platform"

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
    registered = {(a.name, a.version): a for a in registry.available()}
    retired = {(d.name, d.version) for d in definitions_all().filter(retired_at__isnull=False)
               .only("name", "version")}
    agents: dict[str, list[Version]] = defaultdict(list)
    for key in sorted(registered.keys() | counts.keys(), key=lambda k: (k[0], -k[1])):
        agents[key[0]].append(Version(key[0], key[1], registered.get(key), counts.get(key, {}),
                                      retired=key in retired))
    for versions in agents.values():
        newest = next((v for v in versions if v.agent is not None and not v.retired), None)
        if newest:
            newest.newest = True
    return dict(sorted(agents.items()))


def with_picture(version: Version) -> Version:
    # every tenant agent has the runner's steps: its page shows its definition instead
    if version.agent is not None and version.kind == "platform":
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
    defined = set(definitions_all().values_list("name", flat=True))
    own = [{"name": n, "latest": v[0], "runs": sum(x.total for x in v),
            "unfinished": sum(x.unfinished for x in v)}
           for n, v in listed.items() if n in defined and n not in registry.names()]
    platform = {n: v for n, v in listed.items() if n not in {o["name"] for o in own}}
    return render(request, "dashboard/agents/list.html", {
        "section": "agents", "agents": platform, "own": own, "statuses": STATUSES,
        "tenant": tenant})


@tenant_page(READ)
def agent(request, tenant, name: str):
    listed = versions_by_agent()
    versions = listed.get(name)
    # one of this tenant's definitions (a name none can have finds none)
    if name not in registry.names() and definition_versions(name=name).exists():
        by_version = {v.version: v for v in versions or []}
        return definition_page(request, tenant, name, runs_by_version=by_version)
    if not versions:
        raise Http404("No such agent.")
    return render(request, "dashboard/agents/detail.html", {
        "section": "agents", "name": name, "versions": [with_picture(v) for v in versions],
        "statuses": STATUSES, "tenant": tenant})


urlpatterns = [
    path("agents", agents, name="agents"),
    path("agents/<str:name>", agent, name="agent"),
]
