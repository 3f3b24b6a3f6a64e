"""Metering and quotas (public schema): what each tenant used per UTC day (`UsageDay`, computed
from rows the tenant's runs already wrote), the plans founders sell (`Plan`) and each tenant's
plan and overrides (`TenantQuota`). An empty limit means no limit."""

from django.db import models

from tenants.models import Tenant

# Every quota: (field on Plan / TenantQuota, what it counts, its period).
QUOTA_FIELDS = (
    "concurrent_runs",
    "runs_per_day",
    "tokens_per_month",
    "cost_usd_per_month",
    "hot_bytes",
    "sandbox_cpu_seconds_per_day",
    "api_requests_per_minute",
)


def _limit(help_text: str, decimal: bool = False):
    if decimal:
        return models.DecimalField(max_digits=14, decimal_places=4, null=True, blank=True,
                                   help_text=help_text)
    return models.PositiveBigIntegerField(null=True, blank=True, help_text=help_text)


class QuotaLimits(models.Model):
    """The seven limits; empty: no limit (on a plan) or the plan's (on an override)."""

    concurrent_runs = _limit("Runs queued or running at once.")
    runs_per_day = _limit("Runs started per UTC day.")
    tokens_per_month = _limit("Model tokens (in + out) per UTC calendar month.")
    cost_usd_per_month = _limit("Model cost in USD per UTC calendar month.", decimal=True)
    hot_bytes = _limit("Bytes of the tenant's schema in PostgreSQL (the hot store).")
    sandbox_cpu_seconds_per_day = _limit("Sandbox CPU seconds per UTC day.")
    api_requests_per_minute = _limit("API requests per minute (all the tenant's keys).")

    class Meta:
        abstract = True


class Plan(QuotaLimits):
    """What a tenant may use, unless its TenantQuota overrides a limit. The default plan is
    every tenant's that has none of its own."""

    name = models.CharField(max_length=60, unique=True)
    is_default = models.BooleanField(default=False, help_text="The plan of tenants without one.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["is_default"], condition=models.Q(is_default=True),
                                    name="plan_one_default"),
        ]

    def __str__(self) -> str:
        return self.name


class TenantQuota(QuotaLimits):
    """A tenant's plan and its own limits: a limit set here wins over the plan's."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, primary_key=True,
                                  related_name="quota")
    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, null=True, blank=True,
                             related_name="tenants", help_text="Empty: the default plan.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "tenant quota"

    def __str__(self) -> str:
        return f"{self.tenant} on {self.plan or 'the default plan'}"


class UsageDay(models.Model):
    """One tenant's use on one UTC day, recomputed (idempotently) from its rows by the beat
    task. Counters never go down once written: retention prunes what they were counted from."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="usage_days")
    day = models.DateField()
    runs_started = models.PositiveIntegerField(default=0)
    runs_finished = models.JSONField(default=dict)  # {"succeeded": 3, "failed": 1, ...}
    steps = models.PositiveBigIntegerField(default=0)  # of runs that finished that day
    active_seconds = models.FloatField(default=0.0)  # of runs that finished that day
    tokens_in = models.PositiveBigIntegerField(default=0)
    tokens_out = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    models_used = models.JSONField(default=dict)  # {model: {"tokens_in", "tokens_out", "cost_usd"}}
    effects = models.JSONField(default=dict)  # {connector: effects done that day}
    sandbox_cpu_seconds = models.FloatField(default=0.0)
    sandbox_wall_seconds = models.FloatField(default=0.0)
    hot_bytes = models.PositiveBigIntegerField(default=0)  # as last measured that day
    archive_bytes = models.PositiveBigIntegerField(default=0)  # all archived objects, that day
    api_requests = models.PositiveBigIntegerField(default=0)
    # the Redis life whose count was last copied, and that count (runs.usage.services)
    api_requests_life = models.CharField(max_length=32, blank=True, default="")
    api_requests_seen = models.PositiveBigIntegerField(default=0)
    computed_at = models.DateTimeField()

    class Meta:
        ordering = ["tenant", "day"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "day"], name="usage_day_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant} {self.day}"

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out
