"""Defining agents: a named, versioned set of steps, and the registry that holds them.

    research = Agent("research", version=1, logs=["findings"])

    @research.step(start=True, next=["investigate"])
    def plan(ctx, state):
        return goto("investigate", update={"iteration": 0})

A step is a plain function `(ctx, state) -> transition`. Its declared `next` steps are part of
the agent's topology; the topology hash pins a run to the code it started on.
"""

import hashlib
import importlib
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from jsonschema import Draft202012Validator

from agentplatform.schemas import schema_errors
from agentplatform.wiring import Wiring

from .transitions import Transition


@dataclass(frozen=True)
class RetryPolicy:
    """How often a step that raises is tried, and how long to wait between tries."""

    max_attempts: int = 3
    initial_backoff: float = 0.2
    multiplier: float = 2.0
    max_backoff: float = 10.0

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        return min(self.initial_backoff * self.multiplier ** (attempt - 1), self.max_backoff)


@dataclass(frozen=True)
class RetentionPolicy:
    """How a finished run's rows are kept (enforced by the retention app).

    history: "full" keeps every checkpoint until the TTL; "shallow" keeps only the latest.
    ttl: how long after the run ends its rows stay in the hot store.
    archive_required: archive to S3 before pruning (False: prune without an archive).
    """

    history: str = "full"
    ttl: timedelta = timedelta(days=30)
    archive_required: bool = True

    def __post_init__(self):
        if self.history not in ("full", "shallow"):
            raise ValueError(f"retention history must be 'full' or 'shallow', not {self.history!r}")


@dataclass(frozen=True)
class Step:
    name: str
    fn: Callable[..., Transition]
    next: frozenset[str]
    retry: RetryPolicy | None = None


@dataclass
class Agent:
    name: str
    version: int
    logs: Iterable[str] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    description: str = ""
    # When a model call would exceed the run's budget: "fail" the run, or "approve": park it
    # for a person, who may double the budget.
    on_budget: str = "fail"
    retention: RetentionPolicy | None = None  # None: the RETENTION_* settings
    # What the agent takes as input: a JSON Schema (checked by run_start; None: any object),
    # and an example input a person can start from (the dashboard's start form shows it).
    input_schema: dict | None = None
    input_example: dict | None = None
    # Defaults for run_start's limits (max_steps, max_wall_seconds, max_tokens, max_cost_usd)
    # when the caller sets none.
    limits: dict | None = None
    # A tenant-defined agent: its parsed definition (runs/definitions). Such an agent lives in
    # one tenant's schema, so it is never put in the process-wide registry.
    definition: Any = None
    # More of what the agent's code is, pinned with its topology (a tenant agent: its
    # definition's hash and the runner's version): a run started on other pins is refused.
    pins: dict | None = None
    steps: dict[str, Step] = field(default_factory=dict, init=False)
    start: str | None = field(default=None, init=False)

    def __post_init__(self):
        self.logs = tuple(self.logs)
        if self.input_schema is not None:  # a broken schema fails at import, not at a run's start
            Draft202012Validator.check_schema(self.input_schema)
        if self.definition is None:
            registry.register(self)

    @property
    def kind(self) -> str:
        """"platform" for the operator's agents (AGENT_MODULES), "tenant" for a definition."""
        return "platform" if self.definition is None else "tenant"

    @classmethod
    def from_langgraph(cls, name: str, version: int, build: Any, **options) -> "Agent":
        """Register a LangGraph graph as an agent: `build` is a compiled graph, a StateGraph
        (compiled here) or a function returning either. One step per graph node; the platform
        runs the graph superstep by superstep under the run's lease (runs/graphs/driver.py),
        and the graph's topology pins its runs. `options`: as for `Agent(...)`."""
        agent = cls(name, version, **options)
        try:
            graph_agents()(agent, build)
        except BaseException:
            registry.unregister(name, version)
            raise
        return agent

    def input_errors(self, input: dict) -> list[str]:
        """Where `input` breaks the agent's input schema, one line per failure, each naming
        the path in the input (`$.employee.email`); empty when it conforms or has no schema."""
        if self.input_schema is None:
            return []
        return schema_errors(self.input_schema, input)  # a tenant's schema: never fetches a $ref

    def step(self, *, next: Iterable[str] = (), start: bool = False,
             retry: RetryPolicy | None = None, name: str | None = None):
        """Register the decorated function as a step; `next` names the steps it may go to."""

        def register(fn):
            step_name = name or fn.__name__
            if step_name in self.steps:
                raise ValueError(f"agent {self.name} v{self.version} already has a step {step_name!r}")
            self.steps[step_name] = Step(step_name, fn, frozenset(next), retry)
            if start:
                if self.start is not None:
                    raise ValueError(f"agent {self.name} v{self.version} has two start steps")
                self.start = step_name
            return fn

        return register

    @property
    def topology(self) -> dict:
        topology = {
            "agent": self.name,
            "version": self.version,
            "start": self.start,
            "logs": sorted(self.logs),
            "steps": {name: sorted(step.next) for name, step in sorted(self.steps.items())},
        }
        topology.update(self.pins or {})
        return topology

    @property
    def topology_hash(self) -> str:
        canonical = json.dumps(self.topology, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def check(self) -> None:
        """Refuse an agent whose steps point at steps that don't exist."""
        if self.start is None:
            raise ValueError(f"agent {self.name} v{self.version} has no start step")
        for step in self.steps.values():
            unknown = step.next - self.steps.keys()
            if unknown:
                raise ValueError(
                    f"step {step.name!r} of {self.name} v{self.version} declares unknown "
                    f"next steps {sorted(unknown)}"
                )


class UnknownAgent(LookupError):
    pass


@dataclass(frozen=True)
class TenantAgents:
    """The current tenant's own agents (runs/definitions), wired by the composition root."""

    get: Callable[[str, int | None], Agent | None]  # (name, version or latest); None: no such
    all: Callable[[], list[Agent]]  # every version of every definition, by (name, version)


tenant_agents: Wiring[TenantAgents] = Wiring("tenant-defined agents")
# Gives an agent one step per node of a LangGraph graph, and its pins (runs/graphs/driver.py).
graph_agents: Wiring[Callable[[Agent, Any], None]] = Wiring("LangGraph graphs as agents")


class AgentRegistry:
    """Every registered (agent, version). Old versions stay registered while their runs drain.
    A name no operator agent has is looked up among the current tenant's definitions."""

    def __init__(self):
        self._agents: dict[tuple[str, int], Agent] = {}
        self._loaded = False
        self._lock = threading.Lock()

    def register(self, agent: Agent) -> None:
        self._agents[(agent.name, agent.version)] = agent

    def unregister(self, name: str, version: int) -> None:
        self._agents.pop((name, version), None)

    def load(self) -> None:
        """Import the modules named in settings.AGENT_MODULES (once per process)."""
        with self._lock:
            if self._loaded:
                return

            for module in settings.AGENT_MODULES:
                importlib.import_module(module)
            self._loaded = True

    def get(self, name: str, version: int | None = None) -> Agent:
        self.load()
        versions = [v for (n, v) in self._agents if n == name]
        if not versions:  # operator names are reserved: a definition cannot take one
            agent = tenant_agents().get(name, version)
            if agent is None:
                raise UnknownAgent(f"no agent named {name!r} is registered"
                                   + ("" if version is None else f" with version {version}"))
            return agent
        version = max(versions) if version is None else version
        agent = self._agents.get((name, version))
        if agent is None:
            raise UnknownAgent(f"agent {name!r} version {version} is not registered")
        agent.check()
        return agent

    def all(self) -> list[Agent]:
        """The operator's agents (AGENT_MODULES), by (name, version)."""
        self.load()
        return sorted(self._agents.values(), key=lambda a: (a.name, a.version))

    def available(self) -> list[Agent]:
        """What the current tenant can run: the operator's agents and its own, by (name, version)."""
        return sorted(self.all() + tenant_agents().all(), key=lambda a: (a.name, a.version))

    def names(self) -> set[str]:
        """The operator's agent names (a definition may not take one)."""
        self.load()
        return {name for name, _ in self._agents}


registry = AgentRegistry()
