"""Attacks on the people-and-settings half of the dashboard, each kept as a regression test:
malformed input that used to answer 500, secrets a browser or proxy could keep, and guessing
that throttling did not count. Each test names the attack."""

import contextlib
import io
import re
import threading
import uuid
from urllib.parse import urlencode

from django.conf import settings
from django.core import mail
from django.core.handlers.wsgi import WSGIHandler
from django.db import connection
from django.test import Client, override_settings
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice
from django_tenants.utils import tenant_context

from integrations.selectors import credential_find
from sandboxes.selectors import egress_rules
from sandboxes.services import egress_clear
from tenants.models import Invitation

from .conftest import PASSWORD, person, signed_in


def owner_of(tenant) -> Client:
    client = signed_in(person(tenant, "owner"))
    client.raise_request_exception = False  # a 500 is an answer to assert on, not a crash
    return client


def test_a_credential_name_with_nul_is_not_found_not_a_500(acme):
    """/settings/credentials/<connector>/<label>/delete with %00 in the label: PostgreSQL cannot
    compare text with U+0000, so the lookup raised DataError (500)."""
    client = owner_of(acme)
    assert client.get("/t/acme/settings/credentials/slack/a%00b/delete").status_code == 404
    assert client.post("/t/acme/settings/credentials/slack/a%00b/delete").status_code == 404
    with tenant_context(acme):
        assert credential_find(connector="sl\x00ack", label="default") is None


def long_email(length: int) -> str:
    domain = ".".join(["d" * 60] * 4)[: length - 12] + ".test"
    return f"u{uuid.uuid4().hex[:5]}@{domain}"[:length]


def test_an_invitation_to_an_email_too_long_for_an_account_is_refused_inline(acme):
    """An owner invites an address longer than an account's username can hold (150): over the
    invitation's column (254) the invite answered 500; under it the invitation was sent and its
    acceptance answered 500 when the account was created."""
    client = owner_of(acme)
    for length in (160, 260):
        email = long_email(length)
        response = client.post("/t/acme/members/invite", {"email": email, "role": "viewer"})
        assert response.status_code == 400, (length, response.status_code)
        assert b"too long" in response.content
        assert not Invitation.objects.filter(email=email).exists()
    assert not mail.outbox


def test_credential_secrets_nested_too_deep_are_an_inline_error_not_a_500(acme):
    """An admin pastes JSON nested thousands deep: Python's parser raised RecursionError (500)."""
    client = owner_of(acme)
    for secrets in ("[" * 5000 + "]" * 5000, '{"token": ' + "[" * 3000 + "]" * 3000 + "}"):
        response = client.post("/t/acme/settings/credentials",
                               {"connector": "slack", "label": "deep", "secrets": secrets})
        assert response.status_code == 400
        assert b"nested deeper" in response.content
    with tenant_context(acme):
        assert credential_find(connector="slack", label="deep") is None


def test_the_two_factor_enrolment_page_is_not_kept_by_browsers_or_proxies(acme):
    """The enrolment page shows the TOTP secret (and its QR code): whoever reads a cached copy
    (the browser's history on a shared computer, a caching proxy) holds the second factor."""
    client = owner_of(acme)
    response = client.get("/2fa")
    assert response.status_code == 200 and b'class="secret"' in response.content
    assert "no-store" in response["Cache-Control"]


def test_wrong_codes_sent_at_once_are_each_held_back_by_the_throttle(acme, monkeypatch):
    """A guesser with the password sends many codes at the same moment: django-otp counts a
    failure by reading the device and saving it again, so guesses that read it together all
    passed the throttle (and a lost count left it at one failure). Each is now checked with
    the device locked, after the one before it: the first is wrong, the rest wait out its
    lock. The barrier holds every guess that reaches the code check until all of them have."""
    user = person(acme, "viewer")
    device = TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    signed = signed_in(user)
    guesses = 4
    together = threading.Barrier(guesses, timeout=1.5)
    verify = TOTPDevice.verify_token

    def verify_together(self, token):
        with contextlib.suppress(threading.BrokenBarrierError):
            together.wait()
        return verify(self, token)

    monkeypatch.setattr(TOTPDevice, "verify_token", verify_together)
    code = f"{(totp(device.bin_key) + 500_000) % 10**6:06d}"  # far from the right codes
    answers = []

    def guess():
        client = Client()
        client.cookies = signed.cookies
        answers.append(client.post("/2fa", {"code": code}).content)
        connection.close()

    threads = [threading.Thread(target=guess) for _ in range(guesses)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == guesses
    assert sum(b"That code is not right" in answer for answer in answers) == 1
    assert sum(b"Too many attempts" in answer for answer in answers) == guesses - 1


@override_settings(ADMIN_LOGIN_MAX_FAILURES=3, ADMIN_LOGIN_LOCKOUT_SECONDS=120,
                   ADMIN_LOGIN_USERNAME_MAX_FAILURES=0)
def test_guessing_the_current_password_on_the_account_page_is_throttled_like_the_login(acme):
    """Someone holding a signed-in session (a borrowed laptop) but not the password guessed the
    current password on the account page as fast as they liked: the login's lock never counted
    those guesses, and the right one changes the password (the account is theirs) and tells
    them the old one. Wrong current passwords now count as failed logins of that account from
    that address: past the limit the page refuses even the right one, and so does the login."""
    user = person(acme, "viewer")
    client = signed_in(user)

    def change(current: str):
        return client.post("/account", {"action": "password", "old_password": current,
                                        "new_password1": "a new passphrase 2",
                                        "new_password2": "a new passphrase 2"})

    for _ in range(3):
        assert change("a guess").status_code == 400
    locked = change(PASSWORD)
    assert locked.status_code == 429 and b"Too many wrong passwords" in locked.content
    assert b"incorrectly" not in change("a guess").content  # a guess while locked learns nothing
    user.refresh_from_db()
    assert user.check_password(PASSWORD)  # not changed
    again = Client().post("/login", {"username": user.username, "password": PASSWORD})
    assert again.status_code == 429
    mismatch = signed_in(person(acme, "viewer"))  # new passwords that differ are not guesses
    for _ in range(4):
        assert mismatch.post("/account", {"action": "password", "old_password": PASSWORD,
                                          "new_password1": "one passphrase 77",
                                          "new_password2": "another passphrase 77"}
                             ).status_code == 400
    assert b"Too many wrong passwords" not in mismatch.post("/account", {
        "action": "password", "old_password": PASSWORD, "new_password1": "x",
        "new_password2": "y"}).content


def test_the_password_reset_answers_before_the_email_is_sent(acme):
    """Account enumeration by timing: the "check your email" page was the same for every
    address, but for one with an account it came only after the mail server had taken the
    email (a few hundred milliseconds over a real network), for an unknown one at once. The
    email now goes once the answer is written (the WSGI server's close() of the response):
    here, nothing is sent until the handler's answer is closed."""
    user = person(acme, "viewer")
    browser = Client()
    form = browser.get("/password-reset").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    body = urlencode({"email": user.username, "csrfmiddlewaretoken": token}).encode()
    environ = {
        "REQUEST_METHOD": "POST", "PATH_INFO": "/password-reset", "SCRIPT_NAME": "",
        "QUERY_STRING": "", "SERVER_NAME": "testserver", "SERVER_PORT": "80",
        "HTTP_HOST": "testserver", "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_TYPE": "application/x-www-form-urlencoded", "CONTENT_LENGTH": str(len(body)),
        "HTTP_COOKIE": f"{settings.CSRF_COOKIE_NAME}={browser.cookies[settings.CSRF_COOKIE_NAME].value}",
        "wsgi.input": io.BytesIO(body), "wsgi.url_scheme": "http", "wsgi.errors": io.StringIO(),
        "wsgi.multithread": False, "wsgi.multiprocess": False, "wsgi.run_once": False,
        "wsgi.version": (1, 0),
    }
    statuses = []
    answer = WSGIHandler()(environ, lambda status, headers, *_: statuses.append(status))
    assert statuses == ["302 Found"]
    assert not [m for m in mail.outbox if user.username in m.to]  # the answer is out first
    answer.close()
    assert len([m for m in mail.outbox if user.username in m.to]) == 1


def test_an_invitation_to_a_compatibility_spelling_of_an_email_is_that_email(acme):
    """An owner invites "bob@ａcme.test" (a fullwidth "ａ"): a valid address, delivered to
    bob@acme.test (IDNA maps the domain), shown looking the same, yet a different account:
    already being a member was not noticed, and the account it made could never sign in (the
    login form reads the email in NFKC, as bob@acme.test). Emails are now read in NFKC too."""
    member = person(acme, "viewer")
    local, domain = member.username.split("@")
    lookalike = f"{local}@\uff41{domain[1:]}" if domain.startswith("a") else None
    assert lookalike and lookalike != member.username
    client = owner_of(acme)
    response = client.post("/t/acme/members/invite", {"email": lookalike, "role": "owner"})
    assert response.status_code == 400 and b"is already a member" in response.content
    assert not Invitation.objects.filter(tenant=acme, email__in=[lookalike, member.username],
                                         accepted_at=None, revoked_at=None).exists()


def test_the_two_factor_page_names_only_a_tenant_of_the_person(acme):
    """Content injection on the platform's own address: /2fa?tenant=<any text> printed the
    text as the name of a tenant asking for a code ("… asks for a code from your
    authenticator app"), for a phishing link to dress up. Only a tenant of the person's is
    named now, by its name."""
    client = owner_of(acme)
    spoof = "Security team: call +1 555 0100 and read them your code. Acme"
    page = client.get("/2fa", {"tenant": spoof})
    assert page.status_code == 200 and spoof.encode() not in page.content
    named = client.get("/2fa", {"tenant": "acme"})
    assert f"{acme.name or acme.schema_name} asks for a code".encode() in named.content
    assert b"globex asks" not in client.get("/2fa", {"tenant": "globex"}).content.lower()
    assert client.get("/2fa", {"tenant": "ac\x00me"}).status_code == 200


def test_the_egress_page_does_not_open_the_platforms_own_network_to_a_tenant(acme):
    """A tenant's admin allowed 127.0.0.1:5432 (or the cloud's metadata address, or a private
    10.x one) on the egress page: the proxy that tunnels a sandbox's connections runs on the
    worker's host and connects to a literally named IP even when it is not public, so the
    tenant's code reached the platform's own PostgreSQL, Redis and network. A person of a
    tenant may now allow only public addresses (and names, which the proxy checks when it
    resolves them); nothing of a refused list is added."""
    with tenant_context(acme):
        egress_clear()
    client = signed_in(person(acme, "admin"))
    for host in ("127.0.0.1:5432", "169.254.169.254", "10.1.2.3:5000", "[::1]:6379",
                 "[::ffff:127.0.0.1]:6379", "0.0.0.0:80"):
        response = client.post("/t/acme/settings/egress", {"hosts": f"api.example.com\n{host}"})
        assert response.status_code == 400, host
        assert b"not a public address" in response.content
    with tenant_context(acme):
        assert not [str(rule) for rule in egress_rules()]
    allowed = client.post("/t/acme/settings/egress", {"hosts": "93.184.216.34:443"})
    assert allowed.status_code == 302
    with tenant_context(acme):
        assert [str(rule) for rule in egress_rules()] == ["93.184.216.34:443"]
        egress_clear()
