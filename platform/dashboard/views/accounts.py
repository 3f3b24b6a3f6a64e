"""A person's own access: signing in and out, the first page after it (their tenants), accepting
an invitation, resetting a forgotten password by email, the second step of two-factor sign-in
(TOTP: enrolment and codes) and their account page (password, two-factor device).

Personal changes (a password changed or reset, a device set up or removed) are recorded in the
audit log of every tenant the person belongs to: those tenants' owners answer for who gets in."""

import base64
import hashlib
import logging
import math
from urllib.parse import urlencode

import segno
from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model, login, update_session_auth_hash
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import (
    AuthenticationForm,
    PasswordChangeForm,
    PasswordResetForm,
    SetPasswordForm,
)
from django.core.cache import cache
from django.db import transaction
from django.http import HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import path, reverse, reverse_lazy
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django_otp import login as otp_login
from django_otp.plugins.otp_totp.models import TOTPDevice
from redis.exceptions import RedisError

from tenants.people import (
    PeopleError,
    actor_of,
    audit_record,
    invitation_accept,
    invitation_for,
    membership_in,
    memberships_of,
)
from tenants.throttling import login_failure_record, login_locked_for

log = logging.getLogger(__name__)

RESET_EMAIL_INTERVAL_SECONDS = 120  # at most one password reset email per account this often


def dashboard_url(request, path: str) -> str:
    """An absolute link for an email: under settings.DASHBOARD_URL when set (behind a proxy the
    request's host may not be the public one), else the request's own address."""
    if settings.DASHBOARD_URL:
        return settings.DASHBOARD_URL.rstrip("/") + path
    return request.build_absolute_uri(path)


def _record_for_tenants(user, action: str) -> None:
    actor = actor_of(user)
    for membership in memberships_of(user):
        audit_record(tenant=membership.tenant, actor=actor, action=action, target=actor)


# -- signing in ----------------------------------------------------------------------------------

class EmailAuthenticationForm(AuthenticationForm):
    """Django's login form, asking for the email (the username) and reading it as accounts
    are keyed: stripped and lowercased."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["username"].label = "Email"
        self.fields["username"].widget.attrs.update({"autocomplete": "email", "type": "email"})

    def clean_username(self):
        return (self.cleaned_data.get("username") or "").strip().lower()


class LoginView(auth_views.LoginView):
    template_name = "dashboard/accounts/login.html"
    authentication_form = EmailAuthenticationForm
    redirect_authenticated_user = True


@login_required
def home(request):
    """One tenant (or the one the switcher asks for): its runs. Several: pick one. None: say so."""
    memberships = list(memberships_of(request.user))
    asked = [m for m in memberships if m.tenant.schema_name == request.GET.get("tenant")]
    if asked or len(memberships) == 1:
        return redirect("dashboard:runs", tenant=(asked or memberships)[0].tenant.schema_name)
    return render(request, "dashboard/accounts/home.html", {"memberships": memberships})


# -- invitations ---------------------------------------------------------------------------------

def invite(request, token):
    """The emailed link. A new person chooses a password and is signed in; an existing account
    signs in first and then joins; a signed-in person of another email is told so. Every
    invalid link (unknown, expired, used, revoked) gets one message."""
    try:
        invitation = invitation_for(token)
    except PeopleError as exc:
        return render(request, "dashboard/accounts/invite_invalid.html",
                      {"message": exc.message}, status=404)
    user = request.user if request.user.is_authenticated else None
    has_account = user is None and get_user_model().objects.filter(
        username=invitation.email).exists()
    wrong_account = user is not None and user.get_username() != invitation.email
    form = None
    if user is None and not has_account:
        invitee = get_user_model()(username=invitation.email, email=invitation.email)
        form = SetPasswordForm(invitee, request.POST if request.method == "POST" else None)
    error = ""
    if request.method == "POST" and not has_account and not wrong_account:
        if form is None or form.is_valid():
            password = form.cleaned_data["new_password1"] if form is not None else None
            try:
                membership = invitation_accept(token=token, password=password, user=user)
            except PeopleError as exc:
                error = exc.message
            else:
                if user is None:
                    login(request, membership.user,
                          backend="django.contrib.auth.backends.ModelBackend")
                tenant = membership.tenant
                messages.success(request, f"Welcome to {tenant.name or tenant.schema_name}: "
                                          f"your role is {membership.role}.")
                return redirect(f"{reverse('dashboard:home')}?tenant={tenant.schema_name}")
    return render(request, "dashboard/accounts/invite.html", {
        "invitation": invitation, "form": form, "has_account": has_account,
        "wrong_account": wrong_account, "error": error, "path": request.path,
    }, status=400 if error or (form is not None and form.errors) else 200)


# -- password reset by email ---------------------------------------------------------------------

class EmailPasswordResetForm(PasswordResetForm):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.held = []  # the emails save() made, sent by send_held()

    def clean_email(self):
        return self.cleaned_data["email"].strip().lower()

    def send_mail(self, *args, **kwargs):
        # Held, not sent: the answer must not wait for the mail server, or how long it took
        # would tell the asker that the email has an account (PasswordResetView sends them).
        self.held.append((args, kwargs))

    def send_held(self) -> None:
        for args, kwargs in self.held:
            super().send_mail(*args, **kwargs)  # a mail server that refuses is logged
        self.held = []

    def get_users(self, email):
        # Accounts are keyed by username (the email). Unlike Django's form, an account made
        # without a password (by an operator's command) may set one here: the email proves it.
        users = get_user_model()._default_manager.filter(username=email, is_active=True)
        if users.exists() and not _reset_email_due(email):
            return []  # one email per interval: the form must not flood anyone's inbox
        return users


def _reset_email_due(email: str) -> bool:
    digest = hashlib.sha256(email.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    try:
        return cache.add(f"password-reset-sent:{digest}", 1, timeout=RESET_EMAIL_INTERVAL_SECONDS)
    except RedisError as exc:  # the cache down must not stop a person resetting their password
        log.warning("password reset interval not checked: %s", exc)
        return True


class PasswordResetView(auth_views.PasswordResetView):
    """Unknown emails get the same "sent" page: the form says nothing about who has an account.
    A mail server that refuses is logged (Django's form does) and the page is the same."""

    form_class = EmailPasswordResetForm
    template_name = "dashboard/accounts/password_reset.html"
    email_template_name = "dashboard/accounts/password_reset_email.txt"
    subject_template_name = "dashboard/accounts/password_reset_subject.txt"
    success_url = reverse_lazy("dashboard:password_reset_done")

    @property
    def extra_email_context(self):
        return {"base_url": dashboard_url(self.request, "/").rstrip("/")}

    def form_valid(self, form):
        super().form_valid(form)  # the form holds the email, if any
        return _RedirectThenSend(self.get_success_url(), form.send_held)


class _RedirectThenSend(HttpResponseRedirect):
    """A redirect that runs `send` in close(), which the WSGI (or ASGI) server calls once it
    has written the response to the client."""

    def __init__(self, url: str, send):
        super().__init__(url)
        self._send = send

    def close(self):
        try:
            self._send()
        except Exception:  # the answer is gone already: a template error is only logged
            log.exception("password reset email not sent")
        finally:
            super().close()


class PasswordResetConfirmView(auth_views.PasswordResetConfirmView):
    template_name = "dashboard/accounts/password_reset_confirm.html"
    success_url = reverse_lazy("dashboard:password_reset_complete")

    def form_valid(self, form):
        response = super().form_valid(form)
        _record_for_tenants(form.user, "account.password_reset")
        return response


# -- two-factor sign-in --------------------------------------------------------------------------

class CodeForm(forms.Form):
    code = forms.CharField(label="Code from your authenticator app", max_length=8,
                           widget=forms.TextInput(attrs={"autocomplete": "one-time-code",
                                                         "inputmode": "numeric"}))

    def clean_code(self):
        code = "".join(self.cleaned_data["code"].split())
        if not code.isdigit():
            raise forms.ValidationError("The code is the 6 digits your app shows.")
        return code


def _device_confirmed(user) -> TOTPDevice | None:
    return TOTPDevice.objects.filter(user=user, confirmed=True).order_by("id").first()


def _code_refused(device: TOTPDevice, code: str) -> str | None:
    """None when the code is right; else why not, for the person. verify_token refuses while
    the device is throttled (each wrong code doubles the wait), so say that first.

    The device's row is locked for the check: django-otp counts a failure (and the last code
    used) by reading the device and saving it again, so codes sent at once would all pass the
    throttle and could replay one another."""
    with transaction.atomic():
        TOTPDevice.objects.select_for_update().filter(pk=device.pk).first()
        device.refresh_from_db()
        allowed, why = device.verify_is_allowed()
        if not allowed:
            locked_until = (why or {}).get("locked_until")
            wait = max(1, int((locked_until - timezone.now()).total_seconds()) + 1) if locked_until else 0
            return ("Too many attempts with wrong codes: "
                    + (f"wait {wait} seconds, then try again." if wait else "try again later."))
        if device.verify_token(code):
            return None
    return "That code is not right (or was already used): try the code your app shows now."


def _next_url(request) -> str:
    wanted = request.POST.get("next") or request.GET.get("next") or ""
    if url_has_allowed_host_and_scheme(wanted, allowed_hosts={request.get_host()},
                                       require_https=request.is_secure()):
        return wanted
    return reverse("dashboard:home")


@never_cache  # the enrolment page shows the TOTP secret: no browser or proxy may keep it
@login_required
def otp(request):
    """The second step: a code from the person's confirmed device verifies the session; a
    person without one enrols here (an unconfirmed device, kept until confirmed, so reloading
    shows the same secret) and the first right code confirms it."""
    next_url = _next_url(request)
    device = _device_confirmed(request.user)
    if device is not None and request.user.is_verified():
        return redirect(next_url)
    enrolling = device is None
    if enrolling:
        device = (TOTPDevice.objects.filter(user=request.user, confirmed=False).order_by("id").first()
                  or TOTPDevice.objects.create(user=request.user, name="dashboard", confirmed=False))
    form = CodeForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        refused = _code_refused(device, form.cleaned_data["code"])
        if refused:
            form.add_error("code", refused)
        else:
            if enrolling:
                device.confirmed = True
                device.save(update_fields=["confirmed"])
                _record_for_tenants(request.user, "account.2fa_enabled")
            otp_login(request, device)
            return redirect(next_url)
    # The tenant that sent the person here, by name: only one of theirs (not any text a link
    # carries, which would read as the platform's own words).
    asking = membership_in(request.user, request.GET.get("tenant", ""))
    context = {"form": form, "next": next_url, "enrolling": enrolling,
               "tenant": (asking.tenant.name or asking.tenant.schema_name) if asking else ""}
    if enrolling:
        context["qr_svg"] = segno.make(device.config_url, error="m").svg_inline(
            scale=5, title="QR code of the two-factor secret", border=2)
        context["secret"] = base64.b32encode(device.bin_key).decode().rstrip("=")
    return render(request, "dashboard/accounts/otp.html", context,
                  status=400 if form.errors else 200)


# -- the person's account ------------------------------------------------------------------------

@login_required
def account(request):
    """Change the password (the current one asked); set up two-factor (on the otp page) or
    remove the device (a current code asked, so a borrowed session cannot)."""
    device = _device_confirmed(request.user)
    if device is not None and not request.user.is_verified():  # the password alone is not enough
        return redirect(f"{reverse('dashboard:otp')}?{urlencode({'next': reverse('dashboard:account')})}")
    action = request.POST.get("action") if request.method == "POST" else None
    password_form = PasswordChangeForm(request.user, request.POST if action == "password" else None)
    remove_form = CodeForm(request.POST if action == "remove_2fa" else None, prefix="remove")
    # A wrong current password is a failed login of this account (a borrowed session must not
    # guess it unthrottled); past the login's limit even the right one is refused here.
    locked_for = login_locked_for(request, request.user.get_username()) if action == "password" else None
    if locked_for is not None:
        password_form = PasswordChangeForm(request.user)  # not checked: its error would answer the guess
        messages.error(request, f"Too many wrong passwords: wait {math.ceil(locked_for / 60)} "
                                "minute(s), then try again.")
        action = None
    elif action == "password" and "old_password" in password_form.errors:
        login_failure_record(request, request.user.get_username())
    if action == "password" and password_form.is_valid():
        password_form.save()
        update_session_auth_hash(request, password_form.user)  # stay signed in here
        _record_for_tenants(request.user, "account.password_changed")
        messages.success(request, "Your password is changed.")
        return redirect("dashboard:account")
    if action == "remove_2fa" and device is not None and remove_form.is_valid():
        refused = _code_refused(device, remove_form.cleaned_data["code"])
        if refused:
            remove_form.add_error("code", refused)
        else:
            TOTPDevice.objects.filter(user=request.user).delete()
            _record_for_tenants(request.user, "account.2fa_removed")
            messages.success(request, "Two-factor sign-in is off for your account.")
            return redirect("dashboard:account")
    requiring = [m.tenant for m in memberships_of(request.user) if m.tenant.require_2fa]
    return render(request, "dashboard/accounts/account.html", {
        "section": "account", "password_form": password_form, "remove_form": remove_form,
        "device": device, "requiring": requiring,
    }, status=429 if locked_for else 400 if password_form.errors or remove_form.errors else 200)


urlpatterns = [
    path("", home, name="home"),
    path("login", LoginView.as_view(), name="login"),
    path("logout", auth_views.LogoutView.as_view(next_page="dashboard:login"), name="logout"),
    path("invite/<str:token>", invite, name="invite"),
    path("password-reset", PasswordResetView.as_view(), name="password_reset"),
    path("password-reset/sent", auth_views.PasswordResetDoneView.as_view(
        template_name="dashboard/accounts/password_reset_done.html"), name="password_reset_done"),
    path("password-reset/<uidb64>/<token>", PasswordResetConfirmView.as_view(),
         name="password_reset_confirm"),
    path("password-reset/done", auth_views.PasswordResetCompleteView.as_view(
        template_name="dashboard/accounts/password_reset_complete.html"),
        name="password_reset_complete"),
    path("2fa", otp, name="otp"),
    path("account", account, name="account"),
]
