"""A tenant's people, for its owners (SETTINGS_MANAGE; every other role gets 403, the list
too): members and their roles, invitations sent by email, whether two-factor sign-in is
required, and the tenant's audit log. Every change goes through tenants.people, which records
it in the audit log with who did it."""

import logging
import smtplib

from django import forms
from django.contrib import messages
from django.core.mail import send_mail
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.views.decorators.http import require_POST

from tenants.models import Invitation, Role
from tenants.people import (
    PeopleError,
    audit_list,
    invitation_create,
    invitation_revoke,
    invitation_undo,
    invitations_open,
    member_remove,
    member_role_set,
    members_of,
    tenant_require_2fa_set,
)
from tenants.roles import SETTINGS_MANAGE

from ..access import tenant_page
from .accounts import dashboard_url

log = logging.getLogger(__name__)

AUDIT_PAGE = 50


class InviteForm(forms.Form):
    email = forms.EmailField(label="Email", widget=forms.EmailInput(attrs={"autocomplete": "off"}))
    role = forms.ChoiceField(label="Role", choices=Role.choices, initial=Role.VIEWER)


def _page(request, invite_form: InviteForm, *, status: int = 200):
    tenant = request.member.tenant
    return render(request, "dashboard/members/list.html", {
        "section": "members", "tenant": tenant, "members": members_of(tenant),
        "invitations": invitations_open(tenant=tenant), "invite_form": invite_form,
        "roles": Role.choices,
    }, status=status)


def _not_found_or(exc: PeopleError) -> str:
    """Another tenant's member or invitation is not found here: 404, as in the API."""
    if exc.code == "not_found":
        raise Http404(exc.message)
    return exc.message


@tenant_page(SETTINGS_MANAGE)
def members(request, tenant):
    return _page(request, InviteForm())


@tenant_page(SETTINGS_MANAGE)
@require_POST
def member_invite(request, tenant):
    """Invite, then email the link. A mail server that refuses undoes the invitation (revoked,
    recorded): nobody holds a link that was never delivered, and an earlier invitation to the
    same address, which this one replaced, is open again."""
    form = InviteForm(request.POST)
    if form.is_valid():
        actor = request.member.actor
        try:
            invited = invitation_create(tenant=request.member.tenant, email=form.cleaned_data["email"],
                                        role=form.cleaned_data["role"], by=actor)
        except PeopleError as exc:
            form.add_error("email", exc.message)
        else:
            try:
                _invitation_send(request, invited)
            except (smtplib.SMTPException, OSError) as exc:
                log.warning("invitation to %s not sent: %s", invited.invitation.email, exc)
                invitation_undo(tenant=request.member.tenant, invited=invited, by=actor)
                form.add_error(None, f"The email to {invited.invitation.email} could not be sent "
                                     f"({exc}), so nobody was invited. Try again later.")
            else:
                messages.success(request, f"Invitation sent to {invited.invitation.email} "
                                          f"({invited.invitation.role}).")
                return redirect("dashboard:members", tenant=tenant)
    return _page(request, form, status=400)


def _invitation_send(request, invited) -> None:
    invitation = invited.invitation
    context = {"invitation": invitation, "tenant": invitation.tenant,
               "link": dashboard_url(request, reverse("dashboard:invite", args=[invited.token]))}
    send_mail(subject=render_to_string("dashboard/members/invitation_subject.txt", context).strip(),
              message=render_to_string("dashboard/members/invitation_email.txt", context),
              from_email=None, recipient_list=[invitation.email])


@tenant_page(SETTINGS_MANAGE)
@require_POST
def member_role(request, tenant, membership_id: int):
    role = request.POST.get("role", "")
    try:
        membership = member_role_set(tenant=request.member.tenant, membership_id=membership_id,
                                     role=role, by=request.member.actor)
    except PeopleError as exc:
        messages.error(request, _not_found_or(exc))
    else:
        messages.success(request, f"{membership.user.username} is now {membership.role}.")
        if membership.user_id == request.user.id and membership.role != Role.OWNER:
            return redirect("dashboard:home")  # no longer an owner: this page is not theirs
    return redirect("dashboard:members", tenant=tenant)


@tenant_page(SETTINGS_MANAGE)
@require_POST
def member_delete(request, tenant, membership_id: int):
    try:
        member_remove(tenant=request.member.tenant, membership_id=membership_id,
                      by=request.member.actor)
    except PeopleError as exc:
        messages.error(request, _not_found_or(exc))
    else:
        if membership_id == request.member.membership.id:
            messages.success(request, "You left the tenant.")
            return redirect("dashboard:home")
        messages.success(request, "The member is removed from this tenant.")
    return redirect("dashboard:members", tenant=tenant)


@tenant_page(SETTINGS_MANAGE)
@require_POST
def invitation_delete(request, tenant, invitation_id):
    try:
        invitation_revoke(tenant=request.member.tenant, invitation_id=invitation_id,
                          by=request.member.actor)
    except PeopleError as exc:
        # This tenant's invitation, accepted or revoked meanwhile (a second click): say so.
        # Another tenant's is not found here.
        mine = Invitation.objects.filter(tenant=request.member.tenant, id=invitation_id).exists()
        messages.error(request, exc.message if mine else _not_found_or(exc))
    else:
        messages.success(request, "The invitation is revoked: its link no longer works.")
    return redirect("dashboard:members", tenant=tenant)


@tenant_page(SETTINGS_MANAGE)
@require_POST
def two_factor(request, tenant):
    required = request.POST.get("require_2fa") == "on"
    tenant_require_2fa_set(tenant=request.member.tenant, required=required, by=request.member.actor)
    messages.success(request, "Two-factor sign-in is now required for everyone in this tenant."
                     if required else "Two-factor sign-in is no longer required in this tenant.")
    return redirect("dashboard:members", tenant=tenant)


@tenant_page(SETTINGS_MANAGE)
def audit(request, tenant):
    entries = audit_list(tenant=request.member.tenant).order_by("-at", "-id")
    page = Paginator(entries, AUDIT_PAGE).get_page(request.GET.get("page"))
    return render(request, "dashboard/members/audit.html", {"section": "members", "page": page})


urlpatterns = [
    path("members", members, name="members"),
    path("members/invite", member_invite, name="member_invite"),
    path("members/<int:membership_id>/role", member_role, name="member_role"),
    path("members/<int:membership_id>/remove", member_delete, name="member_remove"),
    path("members/two-factor", two_factor, name="members_2fa"),
    path("invitations/<uuid:invitation_id>/revoke", invitation_delete, name="invitation_revoke"),
    path("audit", audit, name="audit"),
]
