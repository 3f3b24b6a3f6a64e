"""The current tenant's definitions as agents the engine can run (`runs.agents.TenantAgents`,
wired by the composition root): each version becomes an `Agent` with the runner's steps."""

import dataclasses
import json
import threading
from collections import OrderedDict

from django.db import connection

from runs.agents import Agent

from .models import AgentDefinition
from .runner import runner_agent
from .selectors import agent_limits_default, definition_find, definitions_all
from .spec import Definition, definition_parse

CACHE_SIZE = 2048
_cache: OrderedDict[tuple[str, str, int, str, str], Agent] = OrderedDict()
_lock = threading.Lock()


def _in_a_tenant() -> bool:
    return connection.schema_name not in ("", "public")


def limits_defaulted(definition: Definition, defaults: dict) -> Definition:
    """The definition with the limits it leaves out taken from `defaults` (the tenant's, then the
    platform's). Its spec and hash stay: a default is no change of code, so runs resume."""
    return dataclasses.replace(definition, limits={**defaults, **definition.limits})


def agent_of(row: AgentDefinition, defaults: dict | None = None) -> Agent:
    """The runnable agent for one stored version (cached: a version never changes; the default
    limits it runs with may, so they are part of the key)."""
    defaults = agent_limits_default() if defaults is None else defaults
    key = (connection.schema_name, row.name, row.version, row.spec_hash,
           json.dumps(defaults, sort_keys=True))
    with _lock:
        agent = _cache.get(key)
        if agent is not None:
            _cache.move_to_end(key)
            return agent
    agent = runner_agent(limits_defaulted(definition_parse(row.name, row.spec), defaults),
                         version=row.version)
    with _lock:
        _cache[key] = agent
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return agent


def tenant_agent_get(name: str, version: int | None) -> Agent | None:
    if not _in_a_tenant():
        return None
    row = definition_find(name=name, version=version)
    return None if row is None else agent_of(row)


def tenant_agents_all() -> list[Agent]:
    if not _in_a_tenant():
        return []
    defaults = agent_limits_default()
    return [agent_of(row, defaults) for row in definitions_all()]
