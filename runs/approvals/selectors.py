"""Approval reads: the inbox the API pages through, and one approval by id."""

from uuid import UUID

from django.db.models import QuerySet

from agentplatform.errors import ServiceError

from .models import Approval


def approval_list(*, status: str | None = None, run_id: UUID | None = None) -> QuerySet[Approval]:
    """Approvals, filtered by status and run; an unknown status is invalid_filter."""
    approvals = Approval.objects.all()
    if status:
        if status not in Approval.Status.values:
            raise ServiceError("invalid_filter", f"unknown status {status!r}")
        approvals = approvals.filter(status=status)
    if run_id:
        approvals = approvals.filter(run_id=run_id)
    return approvals


def approval_or_404(approval_id: UUID) -> Approval:
    """The approval, or ServiceError not_found (the API answers 404)."""
    approval = Approval.objects.filter(id=approval_id).first()
    if approval is None:
        raise ServiceError("not_found", "No such approval.")
    return approval
