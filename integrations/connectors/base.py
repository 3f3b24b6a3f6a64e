"""The connector interface: how the effect ledger talks to the world.

The ledger (effects/) decides *whether* to call a connector; a connector only knows *how*.
It gets a `Call` with a stable idempotency key derived from (run, step visit, effect name)
and returns a JSON-serialisable result, or raises `ConnectorError`.
"""

import enum
import importlib
from dataclasses import dataclass, field
from typing import Any, ClassVar
from uuid import UUID

from agentplatform.redaction import secrets_redact


@dataclass(frozen=True)
class Call:
    tenant: str  # schema name
    run_id: UUID
    effect: str  # the effect's name within its step visit
    idempotency_key: str
    args: dict[str, Any]
    credentials: dict[str, Any] = field(default_factory=dict, repr=False)  # never logged


class ConnectorError(Exception):
    """The receiver refused or failed. `retryable`: trying again may succeed; `sent`: the
    request may have reached the receiver (so a blind retry could act twice). The message is
    redacted (agentplatform.redaction) when built: it travels into rows, events and logs."""

    def __init__(self, message: str, *, retryable: bool, sent: bool = False):
        super().__init__(secrets_redact(message))
        self.retryable, self.sent = retryable, sent


class Lookup(enum.Enum):
    """What a receiver that ignores idempotency keys says about an earlier attempt."""

    NOT_FOUND = "not_found"  # authoritative: it never arrived, sending is safe
    UNKNOWN = "unknown"  # cannot tell: a person decides


@dataclass(frozen=True)
class Found:
    result: dict[str, Any]


class Connector:
    name: ClassVar[str]
    # True when the receiver deduplicates by our key (Stripe's Idempotency-Key, our webhooks):
    # an attempt interrupted by a crash is simply sent again with the same key.
    honours_idempotency_key: ClassVar[bool] = False
    # True when acting twice costs only money, never a second visible act (a model call): an
    # attempt that may have been sent is simply made again, and no person is asked.
    safe_to_repeat: ClassVar[bool] = False

    # credential fields that, when present, must be strings (checked when stored)
    credential_strings: ClassVar[tuple[str, ...]] = ()

    def credential_problem(self, secrets: dict[str, Any]) -> str:
        """Why `secrets` cannot be this connector's credential ("" if it can): a wrong type
        would otherwise reach the connector, or a library that fills a gap with our settings."""
        for name in self.credential_strings:
            if name in secrets and not isinstance(secrets[name], str):
                return f"{name!r} must be a string"
        return ""

    def execute(self, call: Call) -> dict[str, Any]:
        raise NotImplementedError

    def args_recorded(self, args: dict[str, Any]) -> dict[str, Any]:
        """What the ledger stores of a call's arguments (its digest still covers all of them):
        a connector whose arguments repeat what the run stores elsewhere keeps a summary."""
        return args

    def lookup(self, call: Call) -> Found | Lookup:
        """For receivers that ignore keys: did an earlier attempt of this call arrive?"""
        return Lookup.UNKNOWN


_connectors: dict[str, Connector] = {}


def connector_register(connector: Connector) -> Connector:
    _connectors[connector.name] = connector
    return connector


BUILTIN = ("email", "slack", "webhook", "payments", "model", "mcp")


def connector_get(name: str) -> Connector:
    if name not in _connectors and name in BUILTIN:
        importlib.import_module(f"{__package__}.{name}")  # registers itself
    try:
        return _connectors[name]
    except KeyError:
        raise LookupError(f"no connector named {name!r}; known: {sorted(_connectors)}") from None
