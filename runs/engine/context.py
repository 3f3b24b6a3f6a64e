"""What a step sees besides its state (`StepContext`): the run, its input, its logs, effects,
notifications, its sandbox and, in a join step, the fan-out's results."""

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError

from ..agents import Agent
from ..models import Branch, Run
from ..state import LogView
from .outcome import CheckpointWriteFailed, LeaseLost
from .ports import BudgetExceeded, NeedsPerson, Scope, ports
from .writer import CheckpointWriter

# Raised to the harness through a step: a step's own `except Exception` cannot swallow them,
# because the context remembers the one it raised and the harness raises it again.
INTERRUPTS = (LeaseLost, NeedsPerson, BudgetExceeded, CheckpointWriteFailed, DatabaseError)


class StepContext:
    """What a step sees besides its state: the run, its input, its logs, the visit."""

    def __init__(self, *, run: Run, agent: Agent, visit: int, attempt: int,
                 logs: dict[str, LogView], writer: CheckpointWriter, item: Any = None,
                 branch: Branch | None = None, epoch: int = -1):
        self.item = item  # in a fan-out branch: its item, and its index in `branch`
        self.branch = None if branch is None else branch.index
        self.scope = f"{visit}" if branch is None else f"{visit}/b{branch.index}"
        # Effects are fenced on the lease that runs this step: the run's, or the branch's own.
        self._fence = (epoch, None) if branch is None else (branch.lease_epoch, branch.id)
        self.interrupt: BaseException | None = None  # what a ctx call raised to stop the step
        self._models = 0
        self.notifications: list[dict] = []
        self.run_id = run.id
        self.input = run.input
        self.agent = agent
        self.visit = visit
        self.attempt = attempt
        self._logs = logs
        self._writer = writer
        self._sandbox = None

    @property
    def sandbox(self):
        """The run's jailed workspace (sandboxes/), opened on first use in this step."""
        if self._sandbox is None:
            self._sandbox = ports().sandbox_session(run_id=self.run_id, visit=self.visit,
                                                    scope=self.scope)
        return self._sandbox

    def step_completed(self) -> None:
        """The step returned a transition: make its sandbox work durable (workspace snapshot)."""
        if self._sandbox is not None:
            self._sandbox.step_completed()

    def log(self, name: str) -> LogView:
        return self._logs[name]

    @property
    def epoch(self) -> int:
        """The lease epoch this step runs under (the run's, or its fan-out branch's)."""
        return self._fence[0]

    def effect(self, name: str, connector: str, *, credential: str = "default", **args) -> Any:
        """Do something externally visible exactly once per (run, step visit, name): a re-run
        of this step gets the recorded result instead of acting again. `credential`: which of
        the tenant's credentials for the connector (by label)."""
        return self.effect_at(self.scope, name, connector, credential=credential, **args)

    def effect_at(self, key: str, name: str, connector: str, *, credential: str = "default",
                  **args) -> Any:
        """`effect`, once per (run, `key`, name) instead of per step visit: for work whose
        identity outlives the visit (a LangGraph task, re-run at a later visit after a crash).
        `key`: at most 40 characters, never a digit string (those are visits)."""
        with self._interrupting():
            self.barrier()  # the state this effect depends on is durable before it happens
            return ports().effect_perform(scope=self._effect_scope(key), name=name,
                                          connector=connector, args=args, credential=credential)

    def effect_outcome_unknown(self, name: str) -> None:
        """Give up on effect `name` of this step, whose last attempt may have reached the
        receiver: the run parks for a person to say whether it went out (never in a fan-out
        branch, which cannot park: there it fails the branch)."""
        with self._interrupting():
            ports().effect_outcome_unknown(scope=self._effect_scope(self.scope), name=name)

    def model(self, messages: list[dict], *, model: str | None = None, name: str | None = None,
              max_tokens: int = 1024, credential: str = "default", **options) -> dict:
        """A chat-completion call through the `model` connector: an effect, so a recorded
        call is never made (or paid for) twice; refused before sending if over budget.
        `credential`: the label of the tenant's model credential (it picks the provider)."""
        self._models += 1
        return self.model_at(self.scope, messages, model=model, max_tokens=max_tokens,
                             name=name or f"model-{self._models}", credential=credential,
                             **options)

    def model_at(self, key: str, messages: list[dict], *, name: str, model: str | None = None,
                 max_tokens: int = 1024, credential: str = "default", **options) -> dict:
        """`model`, keyed like `effect_at`."""
        effects = ports()
        args = {"messages": messages, "max_tokens": max_tokens, **options}
        if model:
            args["model"] = model
        with self._interrupting():
            self.barrier()
            return effects.effect_perform(
                scope=self._effect_scope(key), name=name, connector="model", args=args,
                credential=credential,
                budget_check=effects.budget_checker(run_id=self.run_id,
                                                    requested_tokens=max_tokens))

    def _effect_scope(self, key: str) -> Scope:
        epoch, branch_id = self._fence
        return Scope(self.run_id, key, epoch, branch=branch_id)

    @contextmanager
    def _interrupting(self):
        """Remember an interrupt on its way out: the harness raises it again after the step,
        whatever the step's own `except Exception:` did with it."""
        try:
            yield
        except INTERRUPTS as exc:
            self.interrupt = self.interrupt or exc
            raise

    def notify(self, name: str, connector: str, **args) -> None:
        """Fire and forget: committed with this step's checkpoint, delivered at least once
        afterwards, once at the receiver (its key is stable)."""
        self.notifications.append({"name": name, "connector": connector, "args": args})

    def barrier(self) -> None:
        """Make every checkpoint so far durable; called before anything externally visible."""
        with self._interrupting():
            self._writer.flush()

    @property
    def fan_out(self) -> list["BranchResult"]:
        """In a join step: every branch's outcome, in item order."""
        return [
            BranchResult(b.index, b.item, b.status == Branch.Status.DONE, b.result, b.error)
            for b in Branch.objects.filter(run_id=self.run_id, visit=self.visit).order_by("index")
        ]


@dataclass(frozen=True)
class BranchResult:
    index: int
    item: Any
    ok: bool
    value: Any
    error: str

