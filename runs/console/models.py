"""The founders' console pages that are no table of their own: proxies of the public Tenant model,
so each page is an entry of the admin index with Django's view and change permissions
(`console.view_stuckruns`, `console.change_stuckruns`, `console.view_fleet`)."""

from tenants.models import Tenant


class StuckRuns(Tenant):
    """Runs of every tenant parked by the engine or left with an expired lease."""

    class Meta:
        proxy = True
        verbose_name = "stuck runs (all tenants)"
        verbose_name_plural = "stuck runs (all tenants)"


class Fleet(Tenant):
    """Workers, leases, the ready list, the outbox and timers, across tenants."""

    class Meta:
        proxy = True
        verbose_name = "fleet"
        verbose_name_plural = "fleet"
