"""Usage tests: acme and globex share the database with every other test, so usage is measured
as what a test's own runs added, and quotas are set relative to the use found; each test's
quota rows are removed afterwards."""

import pytest

from runs.usage.models import Plan, TenantQuota


@pytest.fixture
def quotas(acme, globex):
    """`quotas(tenant, runs_per_day=3, ...)`: that tenant's overrides, for this test only."""
    made = []

    def set_quota(tenant, **limits):
        row, _ = TenantQuota.objects.update_or_create(tenant=tenant, defaults=limits)
        made.append(row.pk)
        return row

    yield set_quota
    TenantQuota.objects.filter(pk__in=made).delete()
    Plan.objects.filter(name__startswith="test-").delete()
