"""Transactions that PostgreSQL may abort for a deadlock or a serialization failure, and run again.

The services that wake, decide, cancel and fire timers take row locks in one order
(docs/decisions/0008-lock-order.md); what is left (a deadlock with the dispatcher's ready-list
rows, a child ending while its parent is cancelled) PostgreSQL detects and aborts, and the
service runs again instead of answering 500 or dropping an event.
"""

import functools
import logging
import random
import time

from django.db import DatabaseError, connection

log = logging.getLogger(__name__)

CONFLICT_SQLSTATES = {"40P01", "40001"}  # deadlock_detected, serialization_failure
ATTEMPTS = 8


def is_conflict(exc: BaseException) -> bool:
    """A deadlock or serialization failure: the transaction can simply be run again."""
    cause = exc.__cause__ or exc.__context__
    return getattr(cause, "sqlstate", None) in CONFLICT_SQLSTATES


def retried_on_conflict(service):
    """Run `service` (which opens its own transaction) again when PostgreSQL aborted it as a
    deadlock or serialization victim. Inside a caller's transaction it runs once: the whole
    outer transaction is what was aborted, and only its owner can run it again."""

    @functools.wraps(service)
    def run(*args, **kwargs):
        if connection.in_atomic_block:
            return service(*args, **kwargs)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return service(*args, **kwargs)
            except DatabaseError as exc:
                if attempt == ATTEMPTS or not is_conflict(exc):
                    raise
                log.info("%s: %s; running it again (attempt %d)", service.__name__,
                         type(exc.__cause__ or exc.__context__).__name__, attempt + 1)
                time.sleep(random.uniform(0, 0.02 * 2 ** attempt))  # let the other one finish
        raise AssertionError("unreachable")

    return run
