"""Two-factor sign-in (TOTP): a tenant that requires it keeps every page behind the code; a
person without a device enrols on the same page; wrong codes are refused and throttled; the
account page removes a device only with a current code. Codes are computed here from the
device's key, as an authenticator app would."""

import base64
from urllib.parse import quote

import pytest
from django.test import Client
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice

from tenants.models import AuditEntry, Invitation
from tenants.people import tenant_require_2fa_set

from .conftest import person, signed_in


def code_of(device: TOTPDevice) -> str:
    device.refresh_from_db()
    return f"{totp(device.bin_key, step=device.step, t0=device.t0, digits=device.digits):06d}"


def wrong_code_of(device: TOTPDevice) -> str:
    return f"{(int(code_of(device)) + 1) % 10**6:06d}"


def unthrottled(device: TOTPDevice) -> None:
    """Lift the lock a wrong code set (one second, doubling): the lock has its own test."""
    TOTPDevice.objects.filter(id=device.id).update(throttling_failure_count=0,
                                                   throttling_failure_timestamp=None)


@pytest.fixture
def requiring(globex):
    """globex requires two-factor sign-in for the test (and not after it)."""
    tenant_require_2fa_set(tenant=globex, required=True, by="test")
    yield globex
    tenant_require_2fa_set(tenant=globex, required=False, by="test")


def with_device(user) -> TOTPDevice:
    return TOTPDevice.objects.create(user=user, name="phone", confirmed=True)


def test_a_member_of_a_two_factor_tenant_needs_the_code_for_every_page(requiring):
    user = person(requiring, "owner")
    device = with_device(user)
    login_page = Client().get("/login")
    assert b'name="password"' in login_page.content and b'name="code"' not in login_page.content
    client = signed_in(user)  # the password alone signs in...
    for path in ("/t/globex/runs", "/t/globex/members", "/t/globex/audit"):
        response = client.get(path)  # ...but opens none of the tenant's pages
        assert response.status_code == 302
        assert response["Location"].startswith(f"/2fa?next={quote(path, safe='')}")
    email = "nobody-2fa@globex.test"
    assert client.post("/t/globex/members/invite", {"email": email, "role": "viewer"}).status_code == 302
    assert not Invitation.objects.filter(email=email).exists()

    page = client.get("/2fa?next=/t/globex/runs&tenant=globex")
    assert page.status_code == 200 and b'name="code"' in page.content and b"<svg" not in page.content

    wrong = client.post("/2fa", {"code": wrong_code_of(device), "next": "/t/globex/runs"})
    assert wrong.status_code == 400 and b"That code is not right" in wrong.content
    assert client.get("/t/globex/runs").status_code == 302

    unthrottled(device)
    right = client.post("/2fa", {"code": code_of(device), "next": "/t/globex/runs"})
    assert right.status_code == 302 and right["Location"] == "/t/globex/runs"
    assert client.get("/t/globex/runs").status_code == 200
    assert client.get("/t/globex/members").status_code == 200
    assert signed_in(user).get("/t/globex/runs").status_code == 302  # each session anew


def test_wrong_codes_are_throttled_and_the_page_says_so(requiring):
    user = person(requiring, "viewer")
    device = with_device(user)
    client = signed_in(user)
    client.post("/2fa", {"code": wrong_code_of(device)})
    locked = client.post("/2fa", {"code": code_of(device)})  # even the right one, for now
    assert locked.status_code == 400 and b"Too many attempts with wrong codes" in locked.content
    assert client.get("/t/globex/runs").status_code == 302
    assert TOTPDevice.objects.get(id=device.id).throttling_failure_count == 1


def test_a_person_without_a_device_enrols_with_a_qr_code_and_a_first_code(requiring):
    user = person(requiring, "operator")
    client = signed_in(user)
    assert client.get("/t/globex/runs")["Location"].startswith("/2fa?")
    page = client.get("/2fa?next=/t/globex/runs")
    assert page.status_code == 200
    device = TOTPDevice.objects.get(user=user)
    assert not device.confirmed
    secret = base64.b32encode(device.bin_key).decode().rstrip("=")
    assert b"<svg" in page.content and secret.encode() in page.content  # inline: no image service
    assert b"<img" not in page.content
    assert secret.encode() in client.get("/2fa").content  # a reload shows the same secret
    assert TOTPDevice.objects.filter(user=user).count() == 1

    bad = client.post("/2fa", {"code": "12ab"})
    assert bad.status_code == 400 and b"6 digits" in bad.content
    response = client.post("/2fa", {"code": code_of(device), "next": "/t/globex/runs"})
    assert response.status_code == 302 and response["Location"] == "/t/globex/runs"
    assert TOTPDevice.objects.get(id=device.id).confirmed
    assert client.get("/t/globex/runs").status_code == 200
    assert AuditEntry.objects.filter(tenant=requiring, action="account.2fa_enabled",
                                     actor=f"user:{user.username}").exists()


def test_the_next_page_must_be_on_this_site(acme):
    user = person(acme, "viewer")
    device = with_device(user)
    response = signed_in(user).post("/2fa", {"code": code_of(device),
                                             "next": "https://evil.example/"})
    assert response.status_code == 302 and response["Location"] == "/"


def test_a_tenant_without_the_requirement_opens_with_the_password_alone(acme):
    assert signed_in(person(acme, "viewer")).get("/t/acme/runs").status_code == 200


def test_a_person_with_a_device_gives_its_code_even_where_no_tenant_requires_it(acme):
    user = person(acme, "viewer")
    device = with_device(user)
    client = signed_in(user)
    for page in ("/t/acme/runs", "/account"):
        response = client.get(page)
        assert response.status_code == 302 and response["Location"].startswith("/2fa?next="), page
    assert client.post("/2fa", {"code": code_of(device), "next": "/account"})["Location"] == "/account"
    assert client.get("/t/acme/runs").status_code == 200


def test_the_account_page_removes_the_device_only_with_a_current_code(acme):
    user = person(acme, "viewer")
    device = with_device(user)
    client = signed_in(user)
    client.post("/2fa", {"code": code_of(device), "next": "/account"})
    TOTPDevice.objects.filter(id=device.id).update(last_t=-1)  # as if the next 30 s had come
    page = client.get("/account")
    assert b"Remove the authenticator app" in page.content
    wrong = client.post("/account", {"action": "remove_2fa", "remove-code": wrong_code_of(device)})
    assert wrong.status_code == 400 and b"That code is not right" in wrong.content
    assert TOTPDevice.objects.filter(user=user).exists()
    unthrottled(device)
    right = client.post("/account", {"action": "remove_2fa", "remove-code": code_of(device)})
    assert right.status_code == 302
    assert not TOTPDevice.objects.filter(user=user).exists()
    assert AuditEntry.objects.filter(tenant=acme, action="account.2fa_removed",
                                     actor=f"user:{user.username}").exists()
    after = client.get("/account")
    assert b"Set up two-factor sign-in" in after.content and b"/2fa?next=/account" in after.content
