"""Signing in and out, and the first page after it: the person's tenants."""

from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.shortcuts import redirect, render
from django.urls import path

from tenants.people import memberships_of


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


urlpatterns = [
    path("", home, name="home"),
    path("login", LoginView.as_view(), name="login"),
    path("logout", auth_views.LogoutView.as_view(next_page="dashboard:login"), name="logout"),
]
