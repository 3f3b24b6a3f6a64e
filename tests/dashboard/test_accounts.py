"""A person's own access: accepting an invitation, resetting a password by email through a real
SMTP server, changing it on the account page, the login's throttle and its cookie's flags."""

import re
import uuid
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client, override_settings
from django.utils import timezone

from tenants.models import AuditEntry, Invitation, Membership
from tenants.people import invitation_create, invitation_revoke
from tests.support.fakes.fixtures import smtp_server  # noqa: F401  (a fixture)
from tests.support.fakes.smtp import free_port
from tests.support.mail import link_in, smtp_to, text_of

from .conftest import PASSWORD, person, signed_in

NEW_PASSWORD = "a brand new passphrase 42"


def fresh_email(domain="people.test") -> str:
    return f"p-{uuid.uuid4().hex[:10]}@{domain}"


def invited(tenant, role="approver", email=None):
    email = email or fresh_email()
    return email, invitation_create(tenant=tenant, email=email, role=role, by="user:boss@acme.test")


def logs_in(email: str, password: str) -> bool:
    return Client().post("/login", {"username": email, "password": password}).status_code == 302


# -- invitations ---------------------------------------------------------------------------------

def test_a_new_person_sees_the_invitation_chooses_a_password_and_is_signed_in(acme):
    email, sent = invited(acme, role="approver")
    client = Client()
    page = client.get(f"/invite/{sent.token}")
    assert page.status_code == 200
    for text in (email, "approver", "acme", "Choose a password"):
        assert text.encode() in page.content
    assert b'name="new_password1"' in page.content and b"csrfmiddlewaretoken" in page.content

    response = client.post(f"/invite/{sent.token}", {"new_password1": NEW_PASSWORD,
                                                     "new_password2": NEW_PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/?tenant=acme"
    assert client.get("/t/acme/runs").status_code == 200  # signed in
    membership = Membership.objects.get(user__username=email, tenant=acme)
    assert membership.role == "approver"
    assert AuditEntry.objects.filter(tenant=acme, action="invitation.accepted",
                                     actor=f"user:{email}").exists()
    assert logs_in(email, NEW_PASSWORD)


def test_a_weak_or_mismatched_password_is_shown_inline_and_nothing_is_made(acme):
    email, sent = invited(acme)
    weak = Client().post(f"/invite/{sent.token}", {"new_password1": "12345678",
                                                   "new_password2": "12345678"})
    assert weak.status_code == 400
    assert b"This password is too common" in weak.content and b'class="field-error"' in weak.content
    mismatch = Client().post(f"/invite/{sent.token}", {"new_password1": NEW_PASSWORD,
                                                       "new_password2": NEW_PASSWORD + "x"})
    assert mismatch.status_code == 400 and b"didn" in mismatch.content  # "didn't match"
    assert not get_user_model().objects.filter(username=email).exists()
    assert Client().get(f"/invite/{sent.token}").status_code == 200  # still open


def test_every_invalid_link_gets_one_message(acme):
    _, used = invited(acme)
    Client().post(f"/invite/{used.token}", {"new_password1": NEW_PASSWORD,
                                            "new_password2": NEW_PASSWORD})
    _, expired = invited(acme)
    Invitation.objects.filter(id=expired.invitation.id).update(
        expires_at=timezone.now() - timedelta(seconds=1))
    _, revoked = invited(acme)
    invitation_revoke(tenant=acme, invitation_id=revoked.invitation.id, by="test")
    bodies = set()
    for token in (used.token, expired.token, revoked.token, "no-such-token"):
        for response in (Client().get(f"/invite/{token}"),
                         Client().post(f"/invite/{token}", {"new_password1": NEW_PASSWORD,
                                                            "new_password2": NEW_PASSWORD})):
            assert response.status_code == 404
            assert b"This invitation link is not valid any more" in response.content
            bodies.add(re.search(rb"<main.*</main>", response.content, re.S).group(0))
    assert len(bodies) == 1  # nothing tells one reason from another


def test_an_existing_account_signs_in_first_then_the_link_adds_the_membership(acme, globex):
    user = person(globex, "viewer")
    _, sent = invited(acme, role="operator", email=user.username)
    page = Client().get(f"/invite/{sent.token}")
    assert b"already has an account" in page.content
    assert f"/login?next=/invite/{sent.token}".encode() in page.content
    assert b"new_password1" not in page.content
    Client().post(f"/invite/{sent.token}", {"new_password1": "taken over 1234",
                                            "new_password2": "taken over 1234"})
    assert not Membership.objects.filter(user=user, tenant=acme).exists()
    assert logs_in(user.username, PASSWORD)  # the password was not touched

    client = signed_in(user)
    assert b"Join as operator" in client.get(f"/invite/{sent.token}").content
    response = client.post(f"/invite/{sent.token}")
    assert response.status_code == 302 and response["Location"] == "/?tenant=acme"
    assert Membership.objects.get(user=user, tenant=acme).role == "operator"


def test_the_wrong_account_is_told_whose_invitation_it_is(acme):
    other = person(acme, "viewer")
    email, sent = invited(acme, role="admin")
    client = signed_in(other)
    page = client.get(f"/invite/{sent.token}")
    assert f"This invitation is for {email}; you are signed in as {other.username}".encode() in page.content
    client.post(f"/invite/{sent.token}")
    assert Membership.objects.get(user=other, tenant=acme).role == "viewer"
    assert not Membership.objects.filter(user__username=email).exists()
    assert Client().get(f"/invite/{sent.token}").status_code == 200  # still open for its person


# -- password reset by email ---------------------------------------------------------------------

def test_a_forgotten_password_is_reset_through_the_emailed_link(acme, smtp_server):  # noqa: F811
    user = person(acme, "viewer")
    client = Client()
    assert b"/password-reset" in client.get("/login").content
    with smtp_to(smtp_server, DASHBOARD_URL=""):
        response = client.post("/password-reset", {"email": f" {user.username.upper()} "})
        assert response.status_code == 302 and response["Location"] == "/password-reset/sent"
        assert b"Check your email" in client.get(response["Location"]).content
    [message] = smtp_server.inbox.by_header("To", user.username)
    assert "Reset your Agent Platform password" in message["Subject"]
    link = link_in(message)
    landing = client.get(link)
    assert landing.status_code == 302  # Django moves the token out of the URL into the session
    form = client.get(landing["Location"])
    assert form.status_code == 200 and b'name="new_password1"' in form.content
    weak = client.post(landing["Location"], {"new_password1": "password",
                                             "new_password2": "password"})
    assert weak.status_code == 200 and b"This password is too common" in weak.content
    done = client.post(landing["Location"], {"new_password1": NEW_PASSWORD,
                                             "new_password2": NEW_PASSWORD})
    assert done.status_code == 302 and done["Location"] == "/password-reset/done"
    assert logs_in(user.username, NEW_PASSWORD) and not logs_in(user.username, PASSWORD)
    assert AuditEntry.objects.filter(tenant=acme, action="account.password_reset",
                                     actor=f"user:{user.username}").exists()
    used = Client().get(link, follow=True)
    assert b"This link is not valid any more" in used.content  # works once


def test_the_link_uses_dashboard_url_when_set(acme, smtp_server):  # noqa: F811
    user = person(acme, "viewer")
    with smtp_to(smtp_server, DASHBOARD_URL="https://dash.example.com/"):
        Client().post("/password-reset", {"email": user.username})
    [message] = smtp_server.inbox.by_header("To", user.username)
    assert "https://dash.example.com/password-reset/" in text_of(message)


def test_asking_again_at_once_sends_no_second_email(acme, smtp_server):  # noqa: F811
    user = person(acme, "viewer")
    with smtp_to(smtp_server):
        for _ in range(3):
            response = Client().post("/password-reset", {"email": user.username})
            assert response.status_code == 302 and response["Location"] == "/password-reset/sent"
    assert len(smtp_server.inbox.by_header("To", user.username)) == 1


def test_an_unknown_email_gets_the_same_sent_page_and_no_email(smtp_server):  # noqa: F811
    with smtp_to(smtp_server):
        response = Client().post("/password-reset", {"email": fresh_email("nobody.test")})
    assert response.status_code == 302 and response["Location"] == "/password-reset/sent"
    assert smtp_server.messages == []


def test_a_mail_server_that_is_down_gets_the_same_sent_page_not_an_error(acme):
    user = person(acme, "viewer")

    class Nowhere:
        host, port = "127.0.0.1", free_port()  # nothing listens there

    with smtp_to(Nowhere):
        response = Client().post("/password-reset", {"email": user.username})
    assert response.status_code == 302 and response["Location"] == "/password-reset/sent"


def test_an_account_made_without_a_password_may_set_one_by_email(acme, smtp_server):  # noqa: F811
    email = fresh_email()
    user = get_user_model().objects.create(username=email, email=email)
    user.set_unusable_password()
    user.save()
    with smtp_to(smtp_server):
        Client().post("/password-reset", {"email": email})
    assert len(smtp_server.inbox.by_header("To", email)) == 1


# -- the account page: password --------------------------------------------------------------------

def test_the_account_page_changes_the_password_with_the_current_one(acme):
    user = person(acme, "viewer")
    client = signed_in(user)
    page = client.get("/account")
    assert page.status_code == 200 and b'name="old_password"' in page.content
    wrong = client.post("/account", {"action": "password", "old_password": "not it",
                                     "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert wrong.status_code == 400 and b"Your old password was entered incorrectly" in wrong.content
    assert logs_in(user.username, PASSWORD)
    response = client.post("/account", {"action": "password", "old_password": PASSWORD,
                                        "new_password1": NEW_PASSWORD,
                                        "new_password2": NEW_PASSWORD})
    assert response.status_code == 302
    assert client.get("/t/acme/runs").status_code == 200  # still signed in here
    assert logs_in(user.username, NEW_PASSWORD) and not logs_in(user.username, PASSWORD)
    assert AuditEntry.objects.filter(tenant=acme, action="account.password_changed",
                                     actor=f"user:{user.username}").exists()


def test_the_account_page_needs_sign_in():
    response = Client().get("/account")
    assert response.status_code == 302 and response["Location"].startswith("/login?next=/account")


# -- the login's throttle and cookie -------------------------------------------------------------

@override_settings(ADMIN_LOGIN_MAX_FAILURES=3, ADMIN_LOGIN_LOCKOUT_SECONDS=120,
                   ADMIN_LOGIN_USERNAME_MAX_FAILURES=0)
def test_the_login_is_locked_after_too_many_wrong_passwords_even_to_the_right_one(acme):
    user = person(acme, "viewer")
    for _ in range(3):
        wrong = Client().post("/login", {"username": user.username, "password": "guess"})
        assert wrong.status_code == 200
    locked = Client().post("/login", {"username": user.username, "password": PASSWORD})
    assert locked.status_code == 429
    assert locked["Content-Type"].startswith("text/html")
    assert b"Too many failed sign-ins" in locked.content and b"2 minutes" in locked.content
    assert 1 <= int(locked["Retry-After"]) <= 120
    assert logs_in(person(acme, "viewer").username, PASSWORD)  # another account is not locked


def test_the_session_cookie_is_httponly_and_samesite_lax(acme):
    response = Client().post("/login", {"username": person(acme, "viewer").username,
                                        "password": PASSWORD})
    cookie = response.cookies[settings.SESSION_COOKIE_NAME]
    assert cookie["httponly"] is True and cookie["samesite"] == "Lax"
    assert bool(cookie["secure"]) == settings.SESSION_COOKIE_SECURE
