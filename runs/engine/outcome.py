"""How a pass over a run ends (`Outcome`), and the engine's own exceptions."""

from enum import StrEnum

from ..leases import worker_id  # noqa: F401  (the engine's name for it)


class Outcome(StrEnum):
    NOT_CLAIMED = "not_claimed"  # someone else holds the lease, or nothing to do
    SLICE_USED = "slice_used"  # still runnable: enqueue again
    PARKED = "parked"
    ENDED = "ended"
    LEASE_LOST = "lease_lost"
    DEFERRED = "deferred"  # this worker lacks the run's agent version: back in line, later


class LeaseLost(Exception):
    """The run's lease epoch moved on: another worker owns the run now."""


class CheckpointWriteFailed(Exception):
    """A checkpoint could not be written (async/exit modes): the run must stop here and be
    resumed from its last durable checkpoint, never continue past the gap."""


class StepError(Exception):
    """A step broke the rules of the engine; retrying cannot help."""


class ChildRunRefused(Exception):
    """The child run a step asked for was refused (its agent is unknown, or its input breaks
    that agent's input schema): the same step would ask for it again, so only new code helps."""

