"""Wait on a condition with a deadline, instead of sleeping and hoping."""

from agentplatform.localprocs import wait_for

__all__ = ["wait_for"]
