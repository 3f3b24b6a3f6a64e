"""The session log's one writer: `event_record` appends a RunEvent row. Imports no other app,
so every layer can record what happened to a run."""

from uuid import UUID

from .models import RunEvent


def event_record(*, run_id: UUID, kind: str, visit: int | None = None, **data) -> None:
    RunEvent.objects.create(run_id=run_id, kind=kind, visit=visit, data=data)
