"""The session log's one writer: `event_record` appends a RunEvent row (`event_row`
builds it, for a statement that writes it with others). Imports no other app,
so every layer can record what happened to a run. Tenants read these rows: their error texts are
redacted of credentials and secret URL parts (agentplatform.redaction) on the way in, and
made storable (an exception's message may hold U+0000, which PostgreSQL's text refuses)."""

from uuid import UUID

from agentplatform.redaction import secrets_redact_data
from agentplatform.storable import json_storable

from .models import RunEvent

# The fields that carry error texts (an exception's message, a traceback, why a run stopped).
ERROR_FIELDS = ("error", "traceback", "reason")


def event_record(*, run_id: UUID, kind: str, visit: int | None = None, **data) -> None:
    event_row(run_id=run_id, kind=kind, visit=visit, **data).save(force_insert=True)


def event_row(*, run_id: UUID, kind: str, visit: int | None = None, **data) -> RunEvent:
    """The row `event_record` appends, unsaved: for a statement that writes it with others
    (agentplatform.rows)."""
    for name in ERROR_FIELDS:
        if name in data:
            data[name] = json_storable(secrets_redact_data(data[name]))
    return RunEvent(run_id=run_id, kind=kind, visit=visit, data=data)
