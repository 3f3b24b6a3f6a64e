"""The tenant's own agents in the dashboard: the form that defines one (a new name) or makes its
next version, each definition's page (versions with who and when, the newest definition
readable, the diff from the version before), a page per version, and retiring.

Writes go through runs.definitions.services (definition_create / definition_update /
definition_retire), as the API's do, each with an audit entry in the same transaction; reads
through runs.definitions.selectors. Defining takes AGENTS_DEFINE (owners, admins); reading is
for every member. A name this tenant has not defined is a 404, another tenant's included: its
definitions live in its own schema."""

from django.contrib import messages
from django.db import transaction
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import path, reverse

from integrations.selectors import credential_list
from runs.definitions.models import AgentDefinition
from runs.definitions.selectors import definition_versions
from runs.definitions.services import (
    DefinitionError,
    definition_create,
    definition_retire,
    definition_update,
)
from tenants.people import audit_record
from tenants.roles import AGENTS_DEFINE, READ

from ..access import tenant_page
from ..agent_form import DefinitionForms
from ..diffs import json_diff

VERSIONS_SHOWN = 200  # the newest; older ones open by URL


def _versions(name: str) -> list[AgentDefinition]:
    versions = list(definition_versions(name=name)[:VERSIONS_SHOWN])
    if not versions:
        raise Http404("No such agent.")
    return versions


def _credentials() -> list[tuple[str, str]]:
    return list(credential_list().values_list("connector", "label"))


def _audit(request, action: str, row: AgentDefinition, **detail) -> None:
    audit_record(tenant=request.member.tenant, actor=request.member.actor, action=action,
                 target=f"agent:{row.name}", version=row.version, spec_hash=row.spec_hash, **detail)


def _changes(before: AgentDefinition | None, after: AgentDefinition):
    if before is None:
        return None
    try:
        return json_diff(before.spec, after.spec)
    except RecursionError:  # a stored spec is at most API_JSON_MAX_DEPTH deep; be safe anyway
        return []


def _form_page(request, tenant, forms: DefinitionForms, *, name: str = "", status: int = 200):
    return render(request, "dashboard/agents/form.html", {
        "section": "agents", "tenant": tenant, "forms": forms, "name": name,
        "editing": forms.editing}, status=status)


def _edited(request, tenant, forms: DefinitionForms, *, name: str):
    """A POST of the form: add or remove a tool row (re-rendered, nothing saved), or save."""
    if "add_tool" in request.POST:
        source = request.POST.get("new_tool", "")
        if source not in {value for value, _ in forms.sources}:
            messages.error(request, "Choose what the new tool is made of.")
            return _form_page(request, tenant, forms.rows_changed(), name=name, status=400)
        return _form_page(request, tenant, forms.rows_changed(add=source), name=name)
    if "remove_tool" in request.POST:
        try:
            index = int(request.POST["remove_tool"])
        except ValueError:
            index = None
        return _form_page(request, tenant, forms.rows_changed(remove=index), name=name)
    if not forms.is_valid():
        return _form_page(request, tenant, forms, name=name, status=400)
    spec = forms.spec()
    try:
        with transaction.atomic():  # the version and who wrote it commit together
            if forms.editing:
                before = definition_versions(name=name).first()
                row = definition_update(name=name, spec=spec, by=request.member.actor)
                changed = before is None or row.pk != before.pk
                if changed:
                    _audit(request, "agent.updated", row)
            else:
                row = definition_create(name=forms.definition.cleaned_data["name"], spec=spec,
                                        by=request.member.actor)
                changed = True
                _audit(request, "agent.created", row)
    except DefinitionError as exc:
        if exc.fields:
            forms.errors_place(exc.fields)
        elif exc.code == "definition_exists":
            forms.definition.add_error("name", exc.message)
        else:
            forms.definition.add_error(None, f"{exc.message} ({exc.code})")
        return _form_page(request, tenant, forms, name=name, status=400)
    if changed:
        messages.success(request, f"Saved {row.name} v{row.version}.")
    else:
        messages.info(request, f"Nothing changed: {row.name} stays at v{row.version}.")
    return redirect("dashboard:agent", tenant, row.name)


@tenant_page(AGENTS_DEFINE)
def definition_new(request, tenant):
    if request.method == "POST":
        forms = DefinitionForms(credentials=_credentials(), data=request.POST)
        return _edited(request, tenant, forms, name="")
    return _form_page(request, tenant, DefinitionForms(credentials=_credentials(), spec={}))


@tenant_page(AGENTS_DEFINE)
def definition_edit(request, tenant, name: str):
    newest = _versions(name)[0]
    if request.method == "POST":
        forms = DefinitionForms(credentials=_credentials(), data=request.POST, name=name, editing=True)
        return _edited(request, tenant, forms, name=name)
    forms = DefinitionForms(credentials=_credentials(), spec=newest.spec, name=name, editing=True)
    return _form_page(request, tenant, forms, name=name)


def definition_page(request, tenant, name: str, *, runs_by_version: dict):
    """The page of one of the tenant's agents (dashboard:agent sends a defined name here)."""
    versions = _versions(name)
    newest = versions[0]
    previous = versions[1] if len(versions) > 1 else None
    rows = [{"row": v, "counts": runs_by_version.get(v.version)} for v in versions]
    return render(request, "dashboard/agents/definition.html", {
        "section": "agents", "tenant": tenant, "name": name, "newest": newest, "rows": rows,
        "retired": newest.retired_at is not None, "spec": newest.spec,
        "previous": previous, "diff": _changes(previous, newest)})


@tenant_page(READ)
def definition_version(request, tenant, name: str, version: int):
    newest = _versions(name)[0]
    row = definition_versions(name=name).filter(version=version).first()
    if row is None:
        raise Http404("No such version.")
    previous = definition_versions(name=name).filter(version__lt=version).first()
    return render(request, "dashboard/agents/version.html", {
        "section": "agents", "tenant": tenant, "name": name, "row": row, "spec": row.spec,
        "previous": previous, "diff": _changes(previous, row), "newest": newest})


@tenant_page(AGENTS_DEFINE)
def definition_retire_page(request, tenant, name: str):
    newest = _versions(name)[0]
    if request.method == "POST":
        with transaction.atomic():
            retired = definition_retire(name=name, by=request.member.actor)
            if retired:
                _audit(request, "agent.retired", newest, versions_retired=retired)
        if retired:
            messages.success(request, f"Retired {name}: no new runs start; runs already started "
                                      "finish on their version.")
        else:
            messages.info(request, f"{name} was already retired.")
        return redirect("dashboard:agent", tenant, name)
    return render(request, "dashboard/settings/confirm.html", {
        "section": "agents", "heading": f"Retire {name}?",
        "explanation": "No new runs of any version start (the start form and the API refuse "
                       "them); runs already started finish on the version they started on. "
                       "Saving a new version brings the agent back.",
        "action": "Retire the agent", "back": reverse("dashboard:agent", args=[tenant, name])})


urlpatterns = [
    # "_new": a definition's name starts with a letter, so no agent's page is hidden by this one
    path("agents/_new", definition_new, name="agent_new"),
    path("agents/<str:name>/edit", definition_edit, name="agent_edit"),
    path("agents/<str:name>/retire", definition_retire_page, name="agent_retire"),
    path("agents/<str:name>/versions/<int:version>", definition_version, name="agent_version"),
]
