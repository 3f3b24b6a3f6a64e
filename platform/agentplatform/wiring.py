"""A port's one implementation, wired once at start-up by the composition root
(agentplatform/apps.py) and read wherever the port is used. A lower layer declares what it needs
as a dataclass and a `Wiring` of it; an unwired port fails loudly at its first use instead of
importing the layer above. Imports no app."""

from typing import Generic, TypeVar

from django.core.exceptions import ImproperlyConfigured

T = TypeVar("T")


class Wiring(Generic[T]):
    def __init__(self, what: str):
        self.what, self._wired = what, None

    def wire(self, implementation: T) -> None:
        self._wired = implementation

    def __call__(self) -> T:
        if self._wired is None:
            raise ImproperlyConfigured(f"{self.what} is not wired: agentplatform.apps."
                                       "PlatformConfig (last in INSTALLED_APPS) wires it in ready()")
        return self._wired
