"""The dashboard's URLs: accounts at the root; every tenant page under /t/<tenant>/, the tenant
being the schema name (views get it as their first argument; access.tenant_page checks it)."""

from django.urls import include, path

from .views import accounts, agents, approvals, definitions, members, run, runs, settings, usage

app_name = "dashboard"

tenant_pages = [
    *runs.urlpatterns,
    *run.urlpatterns,
    *approvals.urlpatterns,
    *definitions.urlpatterns,  # before agents/<name>
    *agents.urlpatterns,
    *members.urlpatterns,
    *settings.urlpatterns,
    *usage.urlpatterns,
]

urlpatterns = [
    *accounts.urlpatterns,
    path("t/<slug:tenant>/", include(tenant_pages)),
]
