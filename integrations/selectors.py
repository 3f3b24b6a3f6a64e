"""Credential reads, metadata only: which credentials the current tenant holds. Secrets are
opened by services.credential_get, never here."""

from django.db.models import QuerySet

from agentplatform.errors import ServiceError

from .models import Credential


def credential_list() -> QuerySet[Credential]:
    """A tenant holds a handful of credentials: all of them, by connector and label."""
    return Credential.objects.order_by("connector", "label")


def credential_find(*, connector: str, label: str) -> Credential | None:
    if "\x00" in connector or "\x00" in label:  # never stored, and PostgreSQL refuses to compare it
        return None
    return Credential.objects.filter(connector=connector, label=label).first()


def credential_or_404(*, connector: str, label: str) -> Credential:
    """The credential's row, or ServiceError not_found (the API answers 404)."""
    credential = credential_find(connector=connector, label=label)
    if credential is None:
        raise ServiceError("not_found", "No such credential.")
    return credential
