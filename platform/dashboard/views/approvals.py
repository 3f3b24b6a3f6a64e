"""The approvals inbox: what waits for a person across runs, and deciding one.

Reads go through runs.approvals.selectors and decisions through
runs.approvals.services.approval_decide, like the API; the decision is recorded as the person
(`user:<email>`), who may decide when their role grants APPROVALS_DECIDE and, if the approval
names deciders, one of their identities (`user:<email>`, the bare email, `role:<their role>`)
is among them. Roles are not a ladder here either: `role:approver` admits approvers only.
"""

from uuid import UUID

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import path
from django.utils import timezone

from agentplatform.errors import ServiceError
from runs.approvals.models import Approval
from runs.approvals.selectors import approval_list, approval_or_404
from runs.approvals.services import approval_decide
from tenants.roles import APPROVALS_DECIDE, READ

from ..access import tenant_page
from ..typed_json import json_shown, json_typed

PAGE = 50
SHOWS = {"pending": "Pending", "decided": "Decided"}
# What approving and rejecting mean, per kind (the API's "approve"/"reject" in words).
CHOICES = {
    Approval.Kind.APPROVAL: ("Approve", "Reject"),
    Approval.Kind.EFFECT_OUTCOME: ("Delivered", "Not delivered"),
    Approval.Kind.BUDGET: ("Raise the budget", "Fail the run"),
    Approval.Kind.QUOTA: ("Let this run go past the quota", "Fail the run"),
}
SHOWN_APART = ("title", "body", "artifact")  # the request's other keys are its details


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "approve"), ("reject", "reject"),
                                          ("approve_edited", "approve an edited artifact")])
    comment = forms.CharField(required=False, max_length=10000, widget=forms.Textarea(
        attrs={"rows": 3}), label="Comment (optional)")
    artifact = forms.CharField(required=False, strip=False, label="Artifact (JSON)",
                               widget=forms.Textarea(attrs={
                                   "rows": 14, "spellcheck": "false", "data-json-editor": ""}))

    def __init__(self, *args, editable: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.editable = editable

    def clean(self):
        data = super().clean()
        if data.get("decision") != "approve_edited":
            data["edited"] = None
            return data
        if not self.editable:
            raise forms.ValidationError("This approval has no artifact to edit.")
        try:
            edited = json_typed(data.get("artifact") or "")
        except forms.ValidationError as exc:
            self.add_error("artifact", f"{exc.messages[0]} Nothing was decided.")
            return data
        if edited is None:  # the service reads None as "the artifact as requested"
            self.add_error("artifact", "The edited artifact cannot be null.")
            return data
        data["edited"] = edited
        return data


def may_decide(member, approval: Approval) -> bool:
    """Whether this person may decide it (the service checks again when they do)."""
    if not member.may(APPROVALS_DECIDE) or approval.status != Approval.Status.PENDING:
        return False
    return not approval.deciders or bool(set(member.identities) & set(approval.deciders))


def expired(approval: Approval, now) -> bool:
    return approval.status == Approval.Status.EXPIRED or (
        approval.status == Approval.Status.PENDING and approval.expires_at is not None
        and approval.expires_at <= now)


def shown(approval: Approval, member, now) -> dict:
    """What a template needs of one approval."""
    request = approval.request if isinstance(approval.request, dict) else {}
    approve, reject = CHOICES.get(approval.kind, ("Approve", "Reject"))
    return {
        "approval": approval,
        "title": request.get("title") or approval.get_kind_display(),
        "body": request.get("body", ""),
        "artifact": approval.artifact if approval.status == Approval.Status.APPROVED
        and approval.artifact is not None else request.get("artifact"),
        "has_artifact": "artifact" in request,
        "details": {k: v for k, v in request.items() if k not in SHOWN_APART},
        "expired": expired(approval, now),
        "may_decide": may_decide(member, approval) and not expired(approval, now),
        "approve_label": approve, "reject_label": reject,
        # an effect's outcome or a budget is answered, not edited; nor is a request without one
        "editable": approval.kind == Approval.Kind.APPROVAL and "artifact" in request,
    }


@tenant_page(READ)
def approvals(request, tenant):
    show = request.GET.get("show", "pending")
    if show not in SHOWS:
        show = "pending"
    listed = (approval_list(status=Approval.Status.PENDING) if show == "pending"
              else approval_list().exclude(status=Approval.Status.PENDING))
    now = timezone.now()
    items = [shown(a, request.member, now)
             for a in listed.select_related("run").order_by("-created_at")[:PAGE]]
    return render(request, "dashboard/approvals/list.html", {
        "section": "approvals", "items": items, "show": show, "shows": SHOWS, "now": now,
        "tenant": tenant})


@tenant_page(READ)
def approval(request, tenant, approval_id: UUID):
    try:
        found = approval_or_404(approval_id)  # another tenant's is not in this schema
    except ServiceError as exc:
        raise Http404(exc.message) from exc
    item = shown(found, request.member, timezone.now())
    form, status = None, 200
    if request.method == "POST":
        if not request.member.may(APPROVALS_DECIDE):
            raise PermissionDenied(f"Your role ({request.member.role}) may not decide approvals.")
        form = DecisionForm(request.POST, editable=item["editable"])
        if form.is_valid():
            data = form.cleaned_data
            try:
                decided = approval_decide(
                    approval_id=found.id, approve=data["decision"] != "reject",
                    by=request.member.actor, identities=request.member.identities,
                    comment=data["comment"], artifact=data["edited"])
            except ServiceError as exc:  # closed, expired, not a decider, run not waiting
                messages.error(request, exc.message)
                found.refresh_from_db()
                item = shown(found, request.member, timezone.now())
                status = 409
            else:
                chosen = dict(zip(("approve", "reject"), CHOICES[decided.kind], strict=True))
                said = chosen.get(data["decision"], "Approved with your edits")
                messages.success(request, f"Decided: {said}. Recorded as {request.member.actor}.")
                return redirect("dashboard:approval", tenant=tenant, approval_id=found.id)
        else:
            status = 400
    if form is None:
        form = DecisionForm(editable=item["editable"], initial={"artifact": json_shown(
            item["artifact"], indent=2)})
    return render(request, "dashboard/approvals/detail.html", {
        "section": "approvals", "item": item, "form": form, "tenant": tenant,
        "now": timezone.now()}, status=status)


urlpatterns = [
    path("approvals", approvals, name="approvals"),
    path("approvals/<uuid:approval_id>", approval, name="approval"),
]
