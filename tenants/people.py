"""A tenant's people: accounts (Django users whose username is their email), memberships with a
role, invitations by email, and the tenant's audit log of what its people did.

A person is named `user:<email>` wherever the platform records who did something (a run's
events, an approval's decided_by, the audit log)."""

import hashlib
import hmac
import secrets
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from agentplatform.errors import ServiceError

from .models import AuditEntry, Invitation, Membership, Role, Tenant

INVITATION_TTL = timedelta(days=7)


class PeopleError(ServiceError):
    """A membership or invitation change that cannot be done, with a message for a person."""


def email_normal(raw: str) -> str:
    """The one spelling of an email the platform keys accounts by: NFKC (as the login form reads
    it: "bob@ａcme.test" is bob@acme.test, where its mail goes), stripped and lowercased."""
    email = unicodedata.normalize("NFKC", raw or "").strip().lower()
    try:
        validate_email(email)
    except ValidationError:
        raise PeopleError("invalid_email", f"{raw!r} is not an email address.") from None
    # The email is the account's username: a longer one could be invited but never joined.
    most = get_user_model()._meta.get_field("username").max_length
    if len(email) > most:
        raise PeopleError("invalid_email", f"This email address is too long for an account "
                                           f"(at most {most} characters).")
    return email


def actor_of(user) -> str:
    return f"user:{user.get_username()}"


def decider_identities(user, role: str) -> list[str]:
    """Every name an approval's `deciders` may use for this person: `user:<email>`, the bare
    email (as agents written before accounts name people) and `role:<role>`."""
    email = user.get_username()
    return [f"user:{email}", email, f"role:{role}"]


def audit_record(*, tenant: Tenant, actor: str, action: str, target: str = "", **detail) -> None:
    AuditEntry.objects.create(tenant=tenant, actor=actor[:260], action=action[:60],
                              target=str(target)[:300], detail=detail)


def audit_list(*, tenant: Tenant) -> QuerySet[AuditEntry]:
    return AuditEntry.objects.filter(tenant=tenant)


# -- memberships ---------------------------------------------------------------------------------

def memberships_of(user) -> QuerySet[Membership]:
    """The tenants a person may open in the dashboard (active ones), by schema name."""
    if not user.is_authenticated:
        return Membership.objects.none()
    return (Membership.objects.select_related("tenant")
            .filter(user=user, tenant__status=Tenant.Status.ACTIVE).order_by("tenant__schema_name"))


def membership_in(user, schema: str) -> Membership | None:
    """The person's membership in an active tenant; None for a tenant that does not exist, is
    not active or does not have them (the dashboard answers all three alike: 404)."""
    if "\x00" in schema:  # no schema is named so, and PostgreSQL refuses to compare it
        return None
    return memberships_of(user).filter(tenant__schema_name=schema).first()


def members_of(tenant: Tenant) -> QuerySet[Membership]:
    return Membership.objects.select_related("user").filter(tenant=tenant).order_by("user__username")


def role_check(role: str) -> str:
    if role not in Role.values:
        raise PeopleError("unknown_role", f"Unknown role {role!r}; known: {', '.join(Role.values)}.")
    return role


def user_for(email: str, *, password: str | None = None):
    """The account for an email, created if missing (with `password`, validated, or unusable)."""
    users = get_user_model()
    email = email_normal(email)
    user = users.objects.filter(username=email).first()
    if user is None:
        user = users(username=email, email=email)
        if password is not None:
            _password_valid(password, user)
            user.set_password(password)
        else:
            user.set_unusable_password()
        try:
            with transaction.atomic():
                user.save()
        except IntegrityError:  # made meanwhile by a concurrent request
            user = users.objects.get(username=email)
    return user


def member_add(*, tenant: Tenant, email: str, role: str, by: str,
               password: str | None = None) -> Membership:
    """Add a person (the account is created if missing) or change their role. For operators'
    commands and the invitation's acceptance; the dashboard invites."""
    role_check(role)
    user = user_for(email, password=password)
    with transaction.atomic():
        membership, created = Membership.objects.select_for_update().get_or_create(
            user=user, tenant=tenant, defaults={"role": role})
        if not created and membership.role != role:
            _owner_stays(tenant, membership, role)
            membership.role = role
            membership.save(update_fields=["role"])
        audit_record(tenant=tenant, actor=by, action="member.added" if created else "member.role",
                     target=f"user:{user.username}", role=role)
    return membership


def member_role_set(*, tenant: Tenant, membership_id: int, role: str, by: str) -> Membership:
    role_check(role)
    with transaction.atomic():
        membership = _membership_locked(tenant, membership_id)
        _owner_stays(tenant, membership, role)
        membership.role = role
        membership.save(update_fields=["role"])
        audit_record(tenant=tenant, actor=by, action="member.role",
                     target=f"user:{membership.user.username}", role=role)
    return membership


def member_remove(*, tenant: Tenant, membership_id: int, by: str) -> None:
    with transaction.atomic():
        membership = _membership_locked(tenant, membership_id)
        _owner_stays(tenant, membership, None)
        membership.delete()
        audit_record(tenant=tenant, actor=by, action="member.removed",
                     target=f"user:{membership.user.username}")


def _membership_locked(tenant: Tenant, membership_id: int) -> Membership:
    # The tenant's owners are locked together, so two owners demoting each other at once
    # cannot leave the tenant with none.
    list(Membership.objects.select_for_update().filter(tenant=tenant, role=Role.OWNER))
    membership = (Membership.objects.select_for_update().select_related("user")
                  .filter(tenant=tenant, id=membership_id).first())
    if membership is None:
        raise PeopleError("not_found", "No such member.")
    return membership


def _owner_stays(tenant: Tenant, membership: Membership, new_role: str | None) -> None:
    if membership.role != Role.OWNER or new_role == Role.OWNER:
        return
    if not Membership.objects.filter(tenant=tenant, role=Role.OWNER).exclude(id=membership.id).exists():
        raise PeopleError("last_owner", "A tenant keeps at least one owner: make another member "
                                        "owner first.")


# -- invitations ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Invited:
    invitation: Invitation
    token: str  # the plaintext, for the emailed link only; never stored
    replaced: tuple = ()  # the open invitations to the same address it revoked (ids)
    at: datetime | None = None  # when: their revoked_at


def invitation_create(*, tenant: Tenant, email: str, role: str, by: str) -> Invited:
    """A new invitation (an earlier open one to the same address is revoked). Sending the email
    is the caller's: it knows the dashboard's address."""
    email, role = email_normal(email), role_check(role)
    if Membership.objects.filter(tenant=tenant, user__username=email).exists():
        raise PeopleError("already_member", f"{email} is already a member.")
    token = secrets.token_urlsafe(32)
    now = timezone.now()
    with transaction.atomic():
        earlier = Invitation.objects.select_for_update().filter(
            tenant=tenant, email=email, accepted_at=None, revoked_at=None)
        replaced = tuple(earlier.values_list("id", flat=True))
        Invitation.objects.filter(id__in=replaced).update(revoked_at=now)
        invitation = Invitation.objects.create(
            tenant=tenant, email=email, role=role, token_hash=_digest(token), invited_by=by,
            expires_at=now + INVITATION_TTL)
        audit_record(tenant=tenant, actor=by, action="member.invited", target=f"user:{email}",
                     role=role)
    return Invited(invitation, token, replaced, now)


def invitation_undo(*, tenant: Tenant, invited: Invited, by: str) -> None:
    """Take back an invitation whose email could not be sent: it is revoked, and the open ones
    it replaced are open again (their emails were delivered: their links work again), unless
    revoked by someone else since."""
    with transaction.atomic():
        invitation_revoke(tenant=tenant, invitation_id=invited.invitation.id, by=by)
        reopened = Invitation.objects.filter(
            tenant=tenant, id__in=invited.replaced, accepted_at=None,
            revoked_at=invited.at).update(revoked_at=None)
        if reopened:
            audit_record(tenant=tenant, actor=by, action="invitation.reopened",
                         target=f"user:{invited.invitation.email}", count=reopened)


def invitation_revoke(*, tenant: Tenant, invitation_id, by: str) -> None:
    with transaction.atomic():  # the change and its audit entry, together
        revoked = Invitation.objects.filter(tenant=tenant, id=invitation_id, accepted_at=None,
                                            revoked_at=None).update(revoked_at=timezone.now())
        if not revoked:
            raise PeopleError("not_found", "No such open invitation.")
        audit_record(tenant=tenant, actor=by, action="invitation.revoked",
                     target=str(invitation_id))


def invitations_open(*, tenant: Tenant) -> QuerySet[Invitation]:
    return Invitation.objects.filter(tenant=tenant, accepted_at=None, revoked_at=None,
                                     expires_at__gt=timezone.now()).order_by("-created_at")


def invitation_for(token: str) -> Invitation:
    """The open invitation a token belongs to, or PeopleError (one message for every reason, so
    the link's page tells a guesser nothing)."""
    invitation = (Invitation.objects.select_related("tenant")
                  .filter(token_hash=_digest(token or "")).first())
    expected = invitation.token_hash if invitation else "0" * 64
    if (not hmac.compare_digest(expected, _digest(token or "")) or invitation is None
            or invitation.accepted_at or invitation.revoked_at
            or invitation.expires_at <= timezone.now() or not invitation.tenant.is_active):
        raise PeopleError("invitation_invalid", "This invitation link is not valid any more: ask "
                                                "for a new one.")
    return invitation


def invitation_accept(*, token: str, password: str | None, user=None) -> Membership:
    """Join the tenant: as the signed-in `user` (whose email must be the invited one), or as a
    new account with `password`. An existing account must sign in first."""
    users = get_user_model()
    with transaction.atomic():
        invitation = invitation_for(token)
        invitation = Invitation.objects.select_for_update().get(id=invitation.id)
        invitation_for(token)  # still open once locked: a second acceptance is refused
        if user is None:
            if users.objects.filter(username=invitation.email).exists():
                raise PeopleError("sign_in_first", f"{invitation.email} has an account: sign in, "
                                                   "then open the link again.")
            if not password:
                raise PeopleError("password_required", "Choose a password.")
            user = user_for(invitation.email, password=password)
        elif user.get_username() != invitation.email:
            raise PeopleError("wrong_account", f"This invitation is for {invitation.email}; you "
                                               f"are signed in as {user.get_username()}.")
        invitation.accepted_at = timezone.now()
        invitation.save(update_fields=["accepted_at"])
        membership, _ = Membership.objects.get_or_create(
            user=user, tenant=invitation.tenant, defaults={"role": invitation.role})
        audit_record(tenant=invitation.tenant, actor=actor_of(user), action="invitation.accepted",
                     target=str(invitation.id), role=membership.role)
    return membership


def _password_valid(password: str, user) -> None:
    try:
        validate_password(password, user)
    except ValidationError as exc:
        raise PeopleError("weak_password", " ".join(exc.messages)) from None


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


# -- the tenant's sign-in rules ------------------------------------------------------------------

def tenant_require_2fa_set(*, tenant: Tenant, required: bool, by: str) -> Tenant:
    """Whether the tenant's people need a TOTP code as well as their password to open its pages
    (the dashboard's door checks it at each request). Recorded only when it changes."""
    with transaction.atomic():
        tenant = Tenant.objects.select_for_update().get(id=tenant.id)
        if tenant.require_2fa != required:
            tenant.require_2fa = required
            tenant.save(update_fields=["require_2fa"])
            audit_record(tenant=tenant, actor=by, action="tenant.require_2fa",
                         target=tenant.schema_name, required=required)
    return tenant
