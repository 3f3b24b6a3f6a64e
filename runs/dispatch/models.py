"""The ready list (public schema): every runnable run of every tenant, in one table, so one
query can pick the next runs to hand to workers in a fair order under per-tenant caps.

A row exists while its run is queued or running; it is written in the same transaction as the
run's status (one database, so one transaction spans the tenant schema and public).
"""

from django.db import models

from tenants.models import Tenant


class ReadyRun(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    schema_name = models.CharField(max_length=63)
    run_id = models.UUIDField()
    branch = models.IntegerField(default=-1)  # -1: the run itself; n: fan-out branch n
    ready_at = models.DateTimeField()  # not handed out before then (a deferred run)
    # Since when workers keep handing it back for lack of its agent version (rolling deploy).
    deferred_since = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    # The W3C traceparent of whoever made it runnable (a request, a webhook's delivery), so the
    # worker's run.advance continues that trace, whichever process dispatches it ("": none).
    traceparent = models.CharField(max_length=55, blank=True, default="", db_default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run_id", "branch"], name="ready_run_branch_unique")
        ]
        indexes = [models.Index(fields=["tenant", "dispatched_at", "ready_at"])]


class Wakeup(models.Model):
    """A parked run's due time (a sleep, an approval's or a gate's timeout), kept in public so
    one query finds every due wakeup of every tenant. No Celery ETA: Redis would redeliver
    those after its visibility timeout, and a lost one would never fire."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    schema_name = models.CharField(max_length=63)
    run_id = models.UUIDField()
    visit = models.PositiveIntegerField()  # the parked checkpoint; stale if the run moved on
    due_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run_id", "visit"], name="wakeup_run_visit_unique")
        ]


class TenantDue(models.Model):
    """The due-index: when a tenant next has something due for a periodic sweep (`what`) that
    would otherwise have to look into every tenant's schema. The sweep reads the due rows here
    and visits only those tenants, so its cost follows what is due, not how many tenants exist.

    `due_at` is a lower bound on the tenant's earliest due item: whoever makes an item due
    sooner lowers it (`due_mark`) in the transaction that does so; only the sweep raises it,
    holding the row, after looking (docs/operators.md, "The due-index"). NULL: nothing pending."""

    class What(models.TextChoices):
        OUTBOX = "outbox"  # undelivered notifications (runs.effects): retries, expired claims

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    schema_name = models.CharField(max_length=63)
    what = models.CharField(max_length=20, choices=What.choices)
    due_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["schema_name", "what"], name="tenant_due_unique"),
            models.CheckConstraint(condition=models.Q(what__in=["outbox"]),
                                   name="tenant_due_what_valid"),
        ]
        indexes = [models.Index(fields=["what", "due_at"], name="tenant_due_what_due_at")]


class WorkerHeartbeat(models.Model):
    """A worker process's last heartbeat, one row per process (`host:pid`), upserted by its lease
    heartbeat thread (runs.leases) every RUN_HEARTBEAT_SECONDS: how the console knows which
    workers are alive and how many leases each holds, without reading every tenant's schema."""

    worker = models.CharField(max_length=200, primary_key=True)
    started_at = models.DateTimeField()  # its first beat
    beat_at = models.DateTimeField(db_index=True)
    leases_held = models.PositiveIntegerField(default=0)  # runs and branches, at the last beat

    def __str__(self) -> str:
        return self.worker
