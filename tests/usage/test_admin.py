"""Founders edit plans and tenant quotas in the console (change permission); metered days are
read-only there; staff without the permission are refused."""

import uuid

from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from runs.usage.models import Plan, TenantQuota
from runs.usage.services import usage_day_refresh
from tenants.models import Tenant


def _staff(**kwargs) -> Client:
    user = User.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", password="x", is_staff=True,
                                    **kwargs)
    client = Client()
    client.force_login(user)
    return client, user


def test_a_superuser_edits_a_plan_and_a_tenants_quota(acme, quotas):
    client, _ = _staff(is_superuser=True)
    for url in ("/admin/usage/plan/", "/admin/usage/plan/add/", "/admin/usage/tenantquota/",
                "/admin/usage/tenantquota/add/", "/admin/usage/usageday/"):
        assert client.get(url).status_code == 200, url
    made = client.post("/admin/usage/plan/add/", {"name": "test-pro", "runs_per_day": "500"})
    assert made.status_code == 302, made.content[:3000]
    plan = Plan.objects.get(name="test-pro")
    row = quotas(acme)
    page = client.get(f"/admin/usage/tenantquota/{row.pk}/change/")
    assert page.status_code == 200
    changed = client.post(f"/admin/usage/tenantquota/{row.pk}/change/",
                          {"plan": plan.pk, "tokens_per_month": "1000"})
    assert changed.status_code == 302, changed.content[:3000]
    row = TenantQuota.objects.get(pk=row.pk)
    assert row.plan == plan and row.tokens_per_month == 1000


def test_staff_without_the_permission_cannot_change_quotas(acme, quotas):
    client, user = _staff()
    user.user_permissions.add(Permission.objects.get(codename="view_tenantquota"))
    row = quotas(acme, runs_per_day=5)
    assert client.get("/admin/usage/tenantquota/").status_code == 200
    client.post(f"/admin/usage/tenantquota/{row.pk}/change/", {"runs_per_day": "999999"})
    assert TenantQuota.objects.get(pk=row.pk).runs_per_day == 5
    assert client.get("/admin/usage/plan/").status_code == 403


def test_staff_cannot_change_the_quotas_of_a_superusers_only_tenant(globex, quotas):
    """As the tenants' console: a superusers_only tenant is read-only for other staff, so they
    cannot raise its quotas, nor give it a quota row of their own making."""
    client, user = _staff()
    user.user_permissions.add(*Permission.objects.filter(codename__in=(
        "view_tenantquota", "change_tenantquota", "add_tenantquota")))
    row = quotas(globex, runs_per_day=5)
    Tenant.objects.filter(pk=globex.pk).update(superusers_only=True)
    try:
        client.post(f"/admin/usage/tenantquota/{row.pk}/change/", {"runs_per_day": "999999"})
        assert TenantQuota.objects.get(pk=row.pk).runs_per_day == 5
        TenantQuota.objects.filter(pk=row.pk).delete()
        made = client.post("/admin/usage/tenantquota/add/", {"tenant": globex.pk,
                                                             "runs_per_day": "999999"})
        assert made.status_code == 200  # the form again: globex is not a choice
        assert not TenantQuota.objects.filter(tenant=globex).exists()
    finally:
        Tenant.objects.filter(pk=globex.pk).update(superusers_only=False)


def test_staff_do_not_see_a_superusers_only_tenants_usage_in_the_console(globex):
    """Listed, as the tenant's own page shows it: without its usage (nor its metered days)."""
    usage_day_refresh(tenant=globex, day=timezone.now().date())
    staff, user = _staff()
    user.user_permissions.add(*Permission.objects.filter(codename__in=("view_tenant",
                                                                       "view_usageday")))
    founder, _ = _staff(is_superuser=True)
    marker = "api_requests_per_minute:"  # one per tenant whose usage a row shows
    Tenant.objects.filter(pk=globex.pk).update(superusers_only=True)
    try:
        everyone = founder.get("/admin/tenants/tenant/").content.decode().count(marker)
        page = staff.get("/admin/tenants/tenant/")
        assert page.status_code == 200 and "globex" in page.content.decode()  # still listed
        assert page.content.decode().count(marker) == everyone - 1
        days = staff.get("/admin/usage/usageday/")
        assert days.status_code == 200
        assert days.context["cl"].queryset.filter(tenant=globex).count() == 0
        assert founder.get("/admin/usage/usageday/").context["cl"].queryset \
            .filter(tenant=globex).count() > 0
    finally:
        Tenant.objects.filter(pk=globex.pk).update(superusers_only=False)
