"""Writing tenant-defined agents: a definition is checked (spec.py, with the tenant's
credentials and the operator's agent names) and stored as a new version; versions are never
changed, so a run pinned to one keeps its meaning."""

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from agentplatform.errors import ServiceError
from integrations.selectors import credential_list
from runs.agents import registry

from .models import AgentDefinition, AgentLimits
from .selectors import agent_limits_tenant, definition_versions
from .spec import LIMITS, Definition, DefinitionInvalid, definition_parse, limits_problems


class DefinitionError(ServiceError):
    """A definition that cannot be written; `fields` (for invalid_definition) says where."""

    def __init__(self, code: str, message: str, fields: dict[str, list[str]] | None = None):
        super().__init__(code, message)
        self.fields = fields or {}


def definition_check(*, name: str, spec: Any) -> Definition:
    """Parse `spec` against this tenant's credentials and the operator's agent names."""
    credentials = set(credential_list().values_list("connector", "label"))
    try:
        return definition_parse(name, spec, credentials=credentials, reserved_names=registry.names())
    except DefinitionInvalid as exc:
        raise DefinitionError("invalid_definition", str(exc), exc.fields) from None


def definition_create(*, name: str, spec: Any, by: str = "") -> AgentDefinition:
    """Version 1 of a new definition (definition_exists if the name is taken)."""
    definition = definition_check(name=name, spec=spec)
    if definition_versions(name=name).exists():
        raise DefinitionError("definition_exists", f"an agent named {name!r} exists; PUT makes a new version")
    return _insert(definition, version=1, by=by)


def definition_update(*, name: str, spec: Any, by: str = "") -> AgentDefinition:
    """The next version of an existing definition; an identical definition makes none (the
    current version is returned). Runs on older versions go on on theirs."""
    newest = definition_versions(name=name).first()  # a retired definition comes back with it
    if newest is None:
        raise DefinitionError("not_found", f"no agent named {name!r} is defined in this tenant")
    definition = definition_check(name=name, spec=spec)
    if definition.spec_hash == newest.spec_hash and newest.retired_at is None:
        return newest
    return _insert(definition, version=newest.version + 1, by=by)


def definition_retire(*, name: str, by: str = "") -> int:
    """Stop new runs of every version; runs already started finish on theirs."""
    return definition_versions(name=name).filter(retired_at__isnull=True).update(retired_at=timezone.now())


def agent_limits_set(*, limits: Any, by: str = "") -> dict:
    """Replace the tenant's default limits (a limit left out or null: no tenant default, the
    platform's applies), checked as a definition's `limits` are: invalid_limits, with fields by
    path (`limits.max_turns`)."""
    fields = limits_problems(limits)
    if fields:
        first = next(iter(fields))
        raise DefinitionError("invalid_limits", f"{first}: {fields[first][0]}", fields)
    AgentLimits.objects.update_or_create(id=1, defaults={
        **{key: limits.get(key) for key in LIMITS}, "updated_by": by})
    return agent_limits_tenant()


def _insert(definition: Definition, *, version: int, by: str) -> AgentDefinition:
    try:
        with transaction.atomic():
            return AgentDefinition.objects.create(name=definition.name, version=version,
                                                  spec=definition.spec, spec_hash=definition.spec_hash,
                                                  created_by=by)
    except IntegrityError:  # two writers raced for this version: the other one won
        raise DefinitionError("definition_conflict", f"{definition.name} v{version} was written "
                              "at the same time; try again") from None
