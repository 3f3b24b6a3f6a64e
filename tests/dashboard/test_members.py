"""The members page (owners only): roles changed, members removed (never the last owner),
invitations emailed through a real SMTP server and accepted from the link in the email,
invitations revoked, two-factor required; and the tenant's audit log, newest first, paged."""

import re
import uuid

import pytest
from django.test import Client
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice
from django_tenants.utils import tenant_context

from tenants.models import AuditEntry, Invitation, Membership
from tenants.people import (
    audit_record,
    invitation_create,
    invitations_open,
    member_add,
    tenant_require_2fa_set,
)
from tests.support.fakes.fixtures import smtp_server  # noqa: F401  (a fixture)
from tests.support.fakes.smtp import free_port
from tests.support.mail import link_in, smtp_to, text_of

from .conftest import person, signed_in


def fresh_email() -> str:
    return f"new-{uuid.uuid4().hex[:10]}@invited.test"


def owner_client(tenant):
    owner = person(tenant, "owner")
    return owner, signed_in(owner)


def audited(tenant, action: str, actor: str, target: str = "") -> bool:
    entries = AuditEntry.objects.filter(tenant=tenant, action=action, actor=actor)
    return entries.filter(target=target).exists() if target else entries.exists()


@pytest.mark.parametrize("role", ["admin", "operator", "approver", "viewer"])
def test_only_owners_see_or_change_members(acme, role):
    client = signed_in(person(acme, role))
    victim = person(acme, "viewer")
    membership = Membership.objects.get(user=victim, tenant=acme)
    email = fresh_email()
    for response in (client.get("/t/acme/members"), client.get("/t/acme/audit"),
                     client.post("/t/acme/members/invite", {"email": email, "role": "owner"}),
                     client.post(f"/t/acme/members/{membership.id}/role", {"role": "owner"}),
                     client.post(f"/t/acme/members/{membership.id}/remove"),
                     client.post("/t/acme/members/two-factor", {"require_2fa": "on"})):
        assert response.status_code == 403
    assert not Invitation.objects.filter(email=email).exists()
    membership.refresh_from_db()
    assert membership.role == "viewer"
    acme.refresh_from_db()
    assert not acme.require_2fa
    assert b"/t/acme/members" not in client.get("/t/acme/runs").content  # no link to it either


def test_the_owner_sees_members_with_their_roles_and_a_link_in_the_header(acme):
    owner, client = owner_client(acme)
    approver = person(acme, "approver")
    page = client.get("/t/acme/members")
    assert page.status_code == 200
    assert owner.username.encode() in page.content and approver.username.encode() in page.content
    row = re.search(rf"{re.escape(approver.username)}.*?</tr>".encode(), page.content, re.S).group(0)
    assert b'<option value="approver" selected>' in row
    assert b"csrfmiddlewaretoken" in page.content
    assert b'href="/t/acme/members"' in client.get("/t/acme/runs").content


def test_an_invitation_is_emailed_and_its_link_makes_a_member(acme, smtp_server):  # noqa: F811
    owner, client = owner_client(acme)
    email = fresh_email()
    with smtp_to(smtp_server, DASHBOARD_URL=""):
        response = client.post("/t/acme/members/invite", {"email": f" {email.upper()} ",
                                                          "role": "approver"})
    assert response.status_code == 302 and response["Location"] == "/t/acme/members"
    [open_one] = [i for i in invitations_open(tenant=acme) if i.email == email]
    assert open_one.role == "approver" and open_one.invited_by == f"user:{owner.username}"
    assert audited(acme, "member.invited", f"user:{owner.username}", f"user:{email}")
    page = client.get("/t/acme/members")
    assert b"Invitation sent to" in page.content and email.encode() in page.content

    [message] = smtp_server.inbox.by_header("To", email)
    assert "acme" in message["Subject"] and owner.username in text_of(message)
    link = link_in(message)
    assert link.startswith("/invite/")
    newcomer = Client()
    assert b"approver" in newcomer.get(link).content
    joined = newcomer.post(link, {"new_password1": "a brand new passphrase 42",
                                  "new_password2": "a brand new passphrase 42"})
    assert joined.status_code == 302
    assert Membership.objects.get(user__username=email, tenant=acme).role == "approver"
    assert newcomer.get("/t/acme/runs").status_code == 200
    assert email.encode() not in client.get("/t/acme/members").content.split(b"Open invitations")[1]


def test_the_link_in_the_email_uses_dashboard_url(acme, smtp_server):  # noqa: F811
    _, client = owner_client(acme)
    email = fresh_email()
    with smtp_to(smtp_server, DASHBOARD_URL="https://dash.example.com"):
        client.post("/t/acme/members/invite", {"email": email, "role": "viewer"})
    [message] = smtp_server.inbox.by_header("To", email)
    assert "https://dash.example.com/invite/" in text_of(message)


def test_bad_invitations_are_shown_inline_and_keep_what_was_typed(acme, smtp_server):  # noqa: F811
    _, client = owner_client(acme)
    member = person(acme, "viewer")
    with smtp_to(smtp_server):
        bad = client.post("/t/acme/members/invite", {"email": "not an email", "role": "operator"})
        assert bad.status_code == 400 and b"Enter a valid email address" in bad.content
        assert b'value="not an email"' in bad.content
        assert b'<option value="operator" selected>' in bad.content
        unknown_role = client.post("/t/acme/members/invite", {"email": fresh_email(), "role": "god"})
        assert unknown_role.status_code == 400 and b"Select a valid choice" in unknown_role.content
        again = client.post("/t/acme/members/invite", {"email": member.username, "role": "viewer"})
        assert again.status_code == 400 and b"is already a member" in again.content
    assert smtp_server.messages == []


def test_a_mail_server_that_is_down_undoes_the_invitation(acme):
    owner, client = owner_client(acme)
    email = fresh_email()

    class Nowhere:
        host, port = "127.0.0.1", free_port()  # nothing listens there

    with smtp_to(Nowhere):
        response = client.post("/t/acme/members/invite", {"email": email, "role": "viewer"})
    assert response.status_code == 400 and b"could not be sent" in response.content
    assert email.encode() in response.content  # kept in the form
    assert not [i for i in invitations_open(tenant=acme) if i.email == email]
    assert audited(acme, "invitation.revoked", f"user:{owner.username}")


def test_the_owner_changes_a_role_and_it_is_audited(acme):
    owner, client = owner_client(acme)
    member = person(acme, "viewer")
    membership = Membership.objects.get(user=member, tenant=acme)
    response = client.post(f"/t/acme/members/{membership.id}/role", {"role": "operator"})
    assert response.status_code == 302
    membership.refresh_from_db()
    assert membership.role == "operator"
    assert audited(acme, "member.role", f"user:{owner.username}", f"user:{member.username}")
    assert b"is now operator" in client.get("/t/acme/members").content
    client.post(f"/t/acme/members/{membership.id}/role", {"role": "emperor"})
    assert b"Unknown role" in client.get("/t/acme/members").content
    membership.refresh_from_db()
    assert membership.role == "operator"


def test_the_owner_removes_a_member_who_then_cannot_open_the_tenant(acme):
    owner, client = owner_client(acme)
    member = person(acme, "operator")
    member_client = signed_in(member)
    membership = Membership.objects.get(user=member, tenant=acme)
    assert client.post(f"/t/acme/members/{membership.id}/remove").status_code == 302
    assert not Membership.objects.filter(id=membership.id).exists()
    assert audited(acme, "member.removed", f"user:{owner.username}", f"user:{member.username}")
    assert member_client.get("/t/acme/runs").status_code == 404


def test_the_last_owner_is_neither_removed_nor_demoted(globex):
    owner, client = owner_client(globex)
    # the tests share the database: leave this owner the only one in globex
    Membership.objects.filter(tenant=globex, role="owner").exclude(user=owner).delete()
    membership = Membership.objects.get(user=owner, tenant=globex)
    for url, data in ((f"/t/globex/members/{membership.id}/remove", {}),
                      (f"/t/globex/members/{membership.id}/role", {"role": "viewer"})):
        response = client.post(url, data, follow=True)
        assert response.status_code == 200 and b"A tenant keeps at least one owner" in response.content
    membership.refresh_from_db()
    assert membership.role == "owner"


def test_another_tenants_members_and_invitations_are_404(acme, globex):
    _, client = owner_client(acme)
    theirs = Membership.objects.get(user=person(globex, "viewer"), tenant=globex)
    invited = invitation_create(tenant=globex, email=fresh_email(), role="viewer", by="test")
    assert client.post(f"/t/acme/members/{theirs.id}/role", {"role": "owner"}).status_code == 404
    assert client.post(f"/t/acme/members/{theirs.id}/remove").status_code == 404
    assert client.post(f"/t/acme/invitations/{invited.invitation.id}/revoke").status_code == 404
    assert client.get("/t/globex/members").status_code == 404
    theirs.refresh_from_db()
    assert theirs.role == "viewer"
    assert Invitation.objects.get(id=invited.invitation.id).revoked_at is None


def test_the_owner_revokes_an_invitation_and_its_link_stops_working(acme):
    owner, client = owner_client(acme)
    invited = invitation_create(tenant=acme, email=fresh_email(), role="viewer", by="test")
    page = client.get("/t/acme/members")
    assert f"/t/acme/invitations/{invited.invitation.id}/revoke".encode() in page.content
    response = client.post(f"/t/acme/invitations/{invited.invitation.id}/revoke")
    assert response.status_code == 302
    assert Invitation.objects.get(id=invited.invitation.id).revoked_at is not None
    assert audited(acme, "invitation.revoked", f"user:{owner.username}", str(invited.invitation.id))
    assert Client().get(f"/invite/{invited.token}").status_code == 404
    again = client.post(f"/t/acme/invitations/{invited.invitation.id}/revoke")
    assert again.status_code == 302  # same tenant, not open any more: said, not a 404
    assert b"No such open invitation" in client.get("/t/acme/members").content


def test_the_owner_requires_two_factor_and_is_asked_for_a_code_next(globex):
    owner, client = owner_client(globex)
    try:
        response = client.post("/t/globex/members/two-factor", {"require_2fa": "on"})
        assert response.status_code == 302
        globex.refresh_from_db()
        assert globex.require_2fa
        assert audited(globex, "tenant.require_2fa", f"user:{owner.username}")
        assert client.get("/t/globex/members")["Location"].startswith("/2fa?")
    finally:
        globex.require_2fa = False
        globex.save(update_fields=["require_2fa"])


def test_a_verified_owner_turns_the_requirement_off(globex):
    owner, client = owner_client(globex)
    device = TOTPDevice.objects.create(user=owner, name="phone", confirmed=True)
    tenant_require_2fa_set(tenant=globex, required=True, by="test")
    try:
        code = f"{totp(device.bin_key):06d}"
        assert client.post("/2fa", {"code": code, "next": "/t/globex/members"}).status_code == 302
        page = client.get("/t/globex/members")
        assert b"Stop requiring two-factor sign-in" in page.content
        assert client.post("/t/globex/members/two-factor", {}).status_code == 302
        globex.refresh_from_db()
        assert not globex.require_2fa
        entry = AuditEntry.objects.filter(tenant=globex, action="tenant.require_2fa").first()
        assert entry.actor == f"user:{owner.username}" and entry.detail == {"required": False}
    finally:
        tenant_require_2fa_set(tenant=globex, required=False, by="test")


def test_the_audit_log_lists_newest_first_in_pages_and_only_this_tenants(acme, globex):
    owner, client = owner_client(acme)
    mark = uuid.uuid4().hex[:8]
    with tenant_context(acme):
        for n in range(55):
            audit_record(tenant=acme, actor="user:someone@acme.test", action=f"test.{mark}.{n}")
    audit_record(tenant=globex, actor="user:someone@globex.test", action=f"test.{mark}.globex")
    first = client.get("/t/acme/audit")
    assert first.status_code == 200
    actions = re.findall(rf"test\.{mark}\.(\w+)".encode(), first.content)
    assert actions[:3] == [b"54", b"53", b"52"] and len(actions) == 50
    assert b"globex" not in b"".join(actions)
    second = client.get("/t/acme/audit?page=2")
    assert re.findall(rf"test\.{mark}\.(\w+)".encode(), second.content)[:5] == [
        b"4", b"3", b"2", b"1", b"0"]
    assert b'rel="prev"' in second.content
    member_add(tenant=acme, email=fresh_email(), role="viewer", by=f"user:{owner.username}")
    assert b"member.added" in client.get("/t/acme/audit").content


def test_an_owner_who_steps_down_or_leaves_lands_on_their_tenants(acme):
    person(acme, "owner")  # another owner stays
    owner, client = owner_client(acme)
    mine = Membership.objects.get(user=owner, tenant=acme)
    response = client.post(f"/t/acme/members/{mine.id}/role", {"role": "viewer"})
    assert response.status_code == 302 and response["Location"] == "/"
    mine.refresh_from_db()
    assert mine.role == "viewer"
    owner, client = owner_client(acme)
    mine = Membership.objects.get(user=owner, tenant=acme)
    response = client.post(f"/t/acme/members/{mine.id}/remove")
    assert response.status_code == 302 and response["Location"] == "/"
    assert not Membership.objects.filter(id=mine.id).exists()


def test_the_requirement_is_recorded_only_when_it_changes(globex):
    mark = f"user:{uuid.uuid4().hex[:8]}@globex.test"
    try:
        for required in (True, True, False, False):
            tenant_require_2fa_set(tenant=globex, required=required, by=mark)
        entries = AuditEntry.objects.filter(tenant=globex, actor=mark).order_by("id")
        assert [e.detail["required"] for e in entries] == [True, False]
    finally:
        tenant_require_2fa_set(tenant=globex, required=False, by="test")
