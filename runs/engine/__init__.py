"""The engine: claims a run, loads its checkpoint, runs steps, writes checkpoints.

No HTTP and no Celery in here: the worker task, the tests and the benchmarks all call
`advance()` (and `branch_advance()` for a fan-out branch). It runs in the tenant schema the
caller selected. The seams: `store` (every epoch-fenced statement), `writer` (positions and
the durability-mode writer), `context` (what a step sees), `harness` (the step loop and
parking), `claims` (a pass over a run), `branches` (fan-out branches).
"""

from ..events import event_record
from .branches import branch_advance, branch_release
from .claims import advance, agent_for, run_end_cancelled, run_park_refused, run_release_unknown
from .context import INTERRUPTS, BranchResult, StepContext
from .harness import Harness
from .outcome import CheckpointWriteFailed, LeaseLost, Outcome, StepError, worker_id
from .parking import waiting_of
from .store import branch_claim, checkpoint_commit, run_claim, run_fence
from .writer import CheckpointWriter, Position, position_load

__all__ = [
    "INTERRUPTS", "BranchResult", "CheckpointWriteFailed", "CheckpointWriter", "Harness",
    "LeaseLost", "Outcome", "Position", "StepContext", "StepError", "advance", "agent_for",
    "branch_advance", "branch_claim", "branch_release", "checkpoint_commit", "event_record",
    "position_load", "run_claim", "run_end_cancelled", "run_fence", "run_park_refused",
    "run_release_unknown", "waiting_of", "worker_id",
]
