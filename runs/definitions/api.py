"""REST API of agents (`/api/v1/agents…`, `/api/v1/agent-limits`): the operator's agents and
the tenant's own definitions listed together; a tenant's definitions created, versioned and
retired through runs.definitions.services, whose errors (invalid_definition with `fields`) the
API's one error handler answers. The tenant was selected by the API key."""

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from agentplatform.api_contract import StrictStrings, error
from agentplatform.api_errors import ApiError
from runs.agents import Agent, UnknownAgent, registry
from tenants.models import Scope

from . import services
from .models import AgentDefinition
from .selectors import (
    agent_limits_platform,
    agent_limits_tenant,
    definition_find,
    definition_versions,
    definitions_latest,
)
from .spec import LIMIT_MAXIMUMS, LIMITS

BY_API = "api:{}"


# -- shapes ------------------------------------------------------------------------------------

class AgentSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(["platform", "tenant"], help_text=(
        "`platform`: shipped by the operator; `tenant`: defined by this tenant (`definition`)."))
    name = serializers.CharField()
    version = serializers.IntegerField(help_text="The latest version (what a run starts on).")
    versions = serializers.ListField(child=serializers.IntegerField(),
                                     help_text="Every version runs may be on, oldest first.")
    description = serializers.CharField()
    input_schema = serializers.DictField(allow_null=True, help_text="JSON Schema of a run's input.")
    topology_hash = serializers.CharField()
    steps = serializers.DictField(help_text="Each step and the steps it may go to.")
    definition = serializers.DictField(allow_null=True, help_text=(
        "A tenant agent's definition (latest version), as stored; null for a platform agent."))


class AgentListSerializer(serializers.Serializer):
    results = AgentSerializer(many=True)


class AgentVersionSerializer(serializers.Serializer):
    name = serializers.CharField()
    version = serializers.IntegerField()
    kind = serializers.ChoiceField(["platform", "tenant"])
    topology_hash = serializers.CharField()
    definition = serializers.DictField(allow_null=True, help_text="null for a platform agent.")
    spec_hash = serializers.CharField(allow_null=True, help_text="SHA-256 of the definition.")
    created_by = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField(allow_null=True)
    retired_at = serializers.DateTimeField(allow_null=True, help_text="Starts no new runs since.")


class AgentWrittenSerializer(AgentVersionSerializer):
    created = serializers.BooleanField(help_text=(
        "Whether this request made the version: a PUT of the definition the latest version "
        "already has makes none (false) and answers that version."))


class VersionSummarySerializer(serializers.Serializer):
    version = serializers.IntegerField()
    topology_hash = serializers.CharField()
    spec_hash = serializers.CharField(allow_null=True)
    created_by = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField(allow_null=True)
    retired_at = serializers.DateTimeField(allow_null=True)


class AgentDetailSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(["platform", "tenant"])
    name = serializers.CharField()
    version = serializers.IntegerField(allow_null=True, help_text=(
        "The latest version a run starts on; null when every version is retired."))
    description = serializers.CharField()
    input_schema = serializers.DictField(allow_null=True)
    retired = serializers.BooleanField()
    versions = VersionSummarySerializer(many=True, help_text="Newest first.")


class AgentCreateSerializer(StrictStrings, serializers.Serializer):
    # The name's rules are the definition language's (spec.AGENT_NAME): refused with its fields.
    name = serializers.CharField(max_length=63, help_text=(
        "1-63 lowercase letters, digits, '-' or '_', starting with a letter; not a platform agent's."))
    definition = serializers.DictField(help_text="The definition (docs/agents.md).")


class AgentUpdateSerializer(serializers.Serializer):
    definition = serializers.DictField(help_text="The whole definition of the new version.")


def _limit_schema(key: str) -> dict:
    if LIMITS[key] is int:
        return {"type": "integer", "minimum": 1, "maximum": LIMIT_MAXIMUMS[key], "nullable": True}
    return {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": LIMIT_MAXIMUMS[key],
            "nullable": True}


LIMITS_SCHEMA = {"type": "object", "additionalProperties": False,
                 "properties": {key: _limit_schema(key) for key in LIMITS}}


@extend_schema_field(LIMITS_SCHEMA)
class LimitsField(serializers.DictField):
    """Limits by name (spec.LIMITS); checked by the service as a definition's are."""


class AgentLimitsSerializer(serializers.Serializer):
    tenant = LimitsField(help_text="This tenant's defaults (only those it set).")
    platform = LimitsField(help_text="The platform's defaults (AGENT_DEFAULT_LIMITS).")
    effective = LimitsField(help_text=(
        "What a definition that sets no limit runs with: the tenant's, else the platform's."))


class AgentLimitsUpdateSerializer(serializers.Serializer):
    limits = LimitsField(help_text="The tenant's defaults; a limit left out or null has none.")


def _agent_json(agent: Agent, versions: list[int], row: AgentDefinition | None) -> dict:
    return {"kind": agent.kind, "name": agent.name, "version": agent.version, "versions": versions,
            "description": agent.description, "input_schema": agent.input_schema,
            "topology_hash": agent.topology_hash, "steps": agent.topology["steps"],
            "definition": row.spec if row is not None else None}


def _version_json(row: AgentDefinition, agent: Agent) -> dict:
    return {"name": row.name, "version": row.version, "kind": "tenant",
            "topology_hash": agent.topology_hash, "definition": row.spec, "spec_hash": row.spec_hash,
            "created_by": row.created_by, "created_at": row.created_at, "retired_at": row.retired_at}


def _platform_version_json(agent: Agent) -> dict:
    return {"name": agent.name, "version": agent.version, "kind": "platform",
            "topology_hash": agent.topology_hash, "definition": None, "spec_hash": None,
            "created_by": None, "created_at": None, "retired_at": None}


def _tenant_agent(row: AgentDefinition) -> Agent:
    return registry.get(row.name, row.version)


def _not_platform(name: str) -> None:
    if name in registry.names():
        raise ApiError("platform_agent", f"{name!r} is one of the platform's agents: it is not "
                       "defined by this tenant and cannot be changed or retired here")


def _no_such_agent(name: str) -> ApiError:
    return ApiError("not_found", f"no agent named {name[:100]!r}")


def _tenant_rows(name: str) -> list[AgentDefinition]:
    rows = list(definition_versions(name=name))
    if not rows:
        raise _no_such_agent(name)
    return rows


# -- views ------------------------------------------------------------------------------------

class AgentListCreate(APIView):
    required_scopes = {"GET": Scope.RUNS_READ, "POST": Scope.AGENTS_WRITE}

    @extend_schema(operation_id="agents_list", responses={200: AgentListSerializer})
    def get(self, request):
        """The operator's agents and this tenant's (not retired), each at its latest version."""
        startable = {row.name: row for row in definitions_latest()}
        by_name: dict[str, list[Agent]] = {}
        for agent in registry.available():  # by (name, version)
            if agent.kind == "tenant" and agent.name not in startable:
                continue  # retired
            by_name.setdefault(agent.name, []).append(agent)
        results = []
        for name, agents in sorted(by_name.items()):
            row = startable.get(name) if agents[-1].kind == "tenant" else None
            latest = next(a for a in agents if a.version == row.version) if row else agents[-1]
            results.append(_agent_json(latest, [a.version for a in agents], row))
        return Response({"results": results})

    @extend_schema(request=AgentCreateSerializer, responses={
        201: AgentWrittenSerializer,
        400: error("`invalid_definition`, with `fields`: each path in the definition (`name`, "
                   "`tools[2].approval`, `limits.max_turns`) and what is wrong there."),
        409: error("`definition_exists`: this tenant has an agent of that name (PUT makes a new "
                   "version); `definition_conflict`: written at the same time by another request.")})
    def post(self, request):
        body = AgentCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        row = services.definition_create(name=body.validated_data["name"],
                                         spec=body.validated_data["definition"],
                                         by=BY_API.format(request.user.api_key.name))
        return Response({**_version_json(row, _tenant_agent(row)), "created": True},
                        status=status.HTTP_201_CREATED)


class AgentDetail(APIView):
    required_scopes = {"GET": Scope.RUNS_READ, "PUT": Scope.AGENTS_WRITE, "DELETE": Scope.AGENTS_WRITE}

    @extend_schema(responses={200: AgentDetailSerializer})
    def get(self, request, name):
        if name in registry.names():
            agents = [a for a in registry.all() if a.name == name]
            latest = agents[-1]
            return Response({
                "kind": "platform", "name": name, "version": latest.version,
                "description": latest.description, "input_schema": latest.input_schema,
                "retired": False,
                "versions": [{"version": a.version, "topology_hash": a.topology_hash, "spec_hash": None,
                              "created_by": None, "created_at": None, "retired_at": None}
                             for a in reversed(agents)]})
        rows = _tenant_rows(name)
        current = next((row for row in rows if row.retired_at is None), None)
        shown = _tenant_agent(current or rows[0])
        return Response({
            "kind": "tenant", "name": name, "version": current.version if current else None,
            "description": shown.description, "input_schema": shown.input_schema,
            "retired": current is None,
            "versions": [{"version": row.version, "topology_hash": _tenant_agent(row).topology_hash,
                          "spec_hash": row.spec_hash, "created_by": row.created_by,
                          "created_at": row.created_at, "retired_at": row.retired_at}
                         for row in rows]})

    @extend_schema(request=AgentUpdateSerializer, responses={
        200: AgentWrittenSerializer,
        400: error("`invalid_definition`, with `fields` (as for POST /agents)."),
        403: error("`platform_agent`: the platform's agents are not changed through the API; "
                   "`insufficient_scope`."),
        404: error("`not_found`: this tenant defines no agent of that name (POST creates one)."),
        409: error("`definition_conflict`: another version was written at the same time.")})
    def put(self, request, name):
        """A new version of the definition; runs on older versions go on on theirs. The
        definition the latest version already has makes none (`created`: false). A retired
        agent comes back with the new version."""
        _not_platform(name)
        _tenant_rows(name)
        body = AgentUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        before = definition_versions(name=name).first()
        row = services.definition_update(name=name, spec=body.validated_data["definition"],
                                         by=BY_API.format(request.user.api_key.name))
        created = before is None or row.pk != before.pk
        return Response({**_version_json(row, _tenant_agent(row)), "created": created})

    @extend_schema(request=None, responses={
        200: AgentDetailSerializer,
        403: error("`platform_agent`: the platform's agents are not retired through the API; "
                   "`insufficient_scope`.")})
    def delete(self, request, name):
        """Retire every version: no new runs start on it; runs already started finish on theirs."""
        _not_platform(name)
        _tenant_rows(name)
        services.definition_retire(name=name, by=BY_API.format(request.user.api_key.name))
        return self.get(request, name)


class AgentVersionDetail(APIView):
    required_scopes = {"GET": Scope.RUNS_READ}

    @extend_schema(responses={200: AgentVersionSerializer})
    def get(self, request, name, version):
        if name in registry.names():
            try:
                agent = registry.get(name, version)
            except UnknownAgent:
                raise ApiError("not_found", f"{name!r} has no version {version}") from None
            return Response(_platform_version_json(agent))
        row = definition_find(name=name, version=version)
        if row is None:
            raise ApiError("not_found", f"no agent named {name!r} with version {version}")
        return Response(_version_json(row, _tenant_agent(row)))


class AgentLimitsDetail(APIView):
    required_scopes = {"GET": Scope.RUNS_READ, "PUT": Scope.AGENTS_WRITE}

    @staticmethod
    def _limits() -> dict:
        tenant, platform = agent_limits_tenant(), agent_limits_platform()
        return {"tenant": tenant, "platform": platform, "effective": {**platform, **tenant}}

    @extend_schema(responses={200: AgentLimitsSerializer})
    def get(self, request):
        """The limits a tenant agent runs with where its definition sets none (the definition's
        own win, then the tenant's, then the platform's)."""
        return Response(self._limits())

    @extend_schema(request=AgentLimitsUpdateSerializer, responses={
        200: AgentLimitsSerializer,
        400: error("`invalid_limits`, with `fields` (`limits.max_turns`): an unknown limit, or one "
                   "that is not a positive number within its maximum.")})
    def put(self, request):
        """Replace this tenant's defaults. Runs already started keep the limits they started with."""
        body = AgentLimitsUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.agent_limits_set(limits=body.validated_data["limits"],
                                  by=BY_API.format(request.user.api_key.name))
        return Response(self._limits())
