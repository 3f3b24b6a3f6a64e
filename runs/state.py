"""A run's state as a step sees it: small fields (snapshotted per checkpoint) and append-only
logs (each entry stored once; a checkpoint keeps only how long each log was)."""

from collections.abc import Callable, Iterator, Mapping
from typing import Any
from uuid import UUID

from django.conf import settings

from agentplatform.storable import Unstorable, json_dumped

from .models import LogEntry


class StateTooLarge(ValueError):
    pass


def state_merge(state: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """The new small state; refuses values PostgreSQL cannot store (`json_dumped`) and states
    over RUN_STATE_MAX_BYTES."""
    return state_merge_dumped(state, update)[0]


def state_merge_dumped(state: Mapping[str, Any], update: Mapping[str, Any]
                       ) -> tuple[dict[str, Any], str | None]:
    """`state_merge`, with the new state's JSON as measured (what its checkpoint stores, as
    it was at this step boundary), or None if it had to be measured field by field."""
    merged = {**state, **update}
    try:  # the whole is longer than its values: within the limit, they are too (one call)
        dumped = json_dumped(merged)
        if len(dumped) <= settings.RUN_STATE_MAX_BYTES:
            return merged, dumped
    except Unstorable:
        pass  # which field cannot be stored: below
    sizes = {}
    for name, value in merged.items():
        try:
            json_dumped(name)  # the name may be what cannot be stored
            sizes[name] = len(json_dumped(value))
        except Unstorable as exc:
            raise StateTooLarge(f"state field {name!r} cannot be stored: {exc}") from None
    limit = settings.RUN_STATE_MAX_BYTES
    total = sum(sizes.values())
    if total > limit:
        biggest = max(sizes, key=sizes.get)
        raise StateTooLarge(
            f"small state is {total} bytes, over the {limit}-byte limit; field {biggest!r} "
            f"alone is {sizes[biggest]} bytes: keep large or growing data in an append-only log"
        )
    return merged, None


class State(Mapping):
    """Read-only: a step changes state only through the transition it returns."""

    def __init__(self, fields: Mapping[str, Any], logs: Mapping[str, "LogView"]):
        self._fields = fields
        self._logs = logs

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def log(self, name: str) -> "LogView":
        try:
            return self._logs[name]
        except KeyError:
            raise KeyError(f"no log {name!r}; declare it in Agent(logs=[...])") from None


class LogView:
    """One append-only log up to the run's current offset. Reads go to the database lazily."""

    def __init__(self, run_id: UUID, name: str, offset: Callable[[], int],
                 unwritten: Callable[[str], list[Any]]):
        self.run_id, self.name = run_id, name
        self._offset = offset
        self._unwritten = unwritten

    def __len__(self) -> int:
        return self._offset()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.slice(0, len(self)))

    def __getitem__(self, index: int) -> Any:
        length = len(self)
        if index < 0:
            index += length
        if not 0 <= index < length:
            raise IndexError(f"log {self.name!r} has {length} entries")
        return self.slice(index, index + 1)[0]

    def tail(self, count: int) -> list[Any]:
        length = len(self)
        return self.slice(max(0, length - count), length)

    def slice(self, start: int, stop: int) -> list[Any]:
        unwritten = self._unwritten(self.name)  # entries not yet in the database (exit mode)
        stored_stop = min(stop, self._offset() - len(unwritten))
        values = list(
            LogEntry.objects.filter(run_id=self.run_id, log=self.name, index__gte=start,
                                    index__lt=stored_stop)
            .order_by("index").values_list("value", flat=True)
        ) if start < stored_stop else []
        first_unwritten = self._offset() - len(unwritten)
        for i, value in enumerate(unwritten, start=first_unwritten):
            if start <= i < stop:
                values.append(value)
        return values
