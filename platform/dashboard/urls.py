"""The dashboard's URLs: accounts at the root; every tenant page under /t/<tenant>/, the tenant
being the schema name (views get it as their first argument; access.tenant_page checks it)."""

from django.urls import include, path

from .views import accounts, run, runs

app_name = "dashboard"

tenant_pages = [
    *runs.urlpatterns,
    *run.urlpatterns,
]

urlpatterns = [
    *accounts.urlpatterns,
    path("t/<slug:tenant>/", include(tenant_pages)),
]
