"""Founders' actions from the console, on runs of any tenant (re-queue, migrate, cancel) and on
tenants (suspend, reactivate). Each is done by the service that owns it, and audited twice:

- the console access log (tenants.ConsoleAccess) gets a row per run named, view
  `stuck_action:<action>` or `tenant_action:<action>`, before anything is done: the founders'
  record of who did what to which tenant, kept after the tenant is deleted;
- the tenant's own audit log (tenants.AuditEntry) gets an entry per thing done, actor
  `admin:<username>` (as the run's events name it), so its owners see what the platform did.
"""

from dataclasses import dataclass, field
from uuid import UUID

from django.db import transaction
from django_tenants.utils import tenant_context

from agentplatform.errors import ServiceError
from runs.agents import registry
from runs.models import Run
from runs.services import RunError, run_cancel, run_migrate, run_requeue
from tenants import services as tenant_services
from tenants.models import Tenant
from tenants.people import audit_record
from tenants.services import console_access_record

from .selectors import stuck_runs_here

RUN_ACTIONS = {"requeue": "re-queue", "migrate": "migrate to a newer version", "cancel": "cancel"}
DONE = {"requeue": "run.requeued", "migrate": "run.migrated", "cancel": "run.cancel_requested"}


class ConsoleError(ServiceError):
    """A console action that cannot be done; `message` is for the founder."""


@dataclass
class ActionReport:
    done: list[UUID] = field(default_factory=list)
    refused: list[tuple[UUID, str]] = field(default_factory=list)  # (run, why)


def actor_of(user) -> str:
    return f"admin:{user.get_username()}"


def migrate_target(*, run: Run) -> int:
    """The newest registered version of the run's agent, newer than its own, that has the step
    the run resumes at (its latest checkpoint's); no_newer_version if there is none."""
    checkpoint = run.checkpoints.order_by("-visit").first()
    step = checkpoint.step if checkpoint is not None else None
    newer = sorted((a for a in registry.available()
                    if a.name == run.agent and a.version > run.agent_version),
                   key=lambda a: a.version, reverse=True)
    for agent in newer:
        if step in agent.steps:
            return agent.version
    if newer:
        raise ConsoleError("step_missing", f"no newer version of {run.agent} has the step "
                           f"{step!r} the run resumes at (newest: v{newer[0].version})")
    raise ConsoleError("no_newer_version", f"{run.agent} has no version newer than "
                       f"v{run.agent_version}: deploy one, then migrate")


def stuck_runs_act(*, user, tenant: Tenant, action: str, run_ids: list[UUID],
                   path: str) -> ActionReport:
    """Re-queue, migrate or cancel those of `run_ids` that are still stuck in `tenant` (a run
    that moved on since the page was shown is refused, untouched)."""
    if action not in RUN_ACTIONS:
        raise ConsoleError("unknown_action", f"unknown action {action!r}: one of "
                           f"{', '.join(RUN_ACTIONS)}")
    console_access_record(user=user, tenant=tenant, view=f"stuck_action:{action}", path=path,
                          run_ids=list(run_ids))
    by, report = actor_of(user), ActionReport()
    with tenant_context(tenant):
        still = {s.run_id: s for s in stuck_runs_here(run_ids=run_ids)}
        for run_id in run_ids:
            try:
                stuck, detail = _run_act_if_stuck(action, run_id, by) if run_id in still \
                    else (None, {})
            except (RunError, ConsoleError) as exc:
                report.refused.append((run_id, exc.message))
                continue
            if stuck is None:
                report.refused.append((run_id, "not stuck any more (or no such run): left as is"))
                continue
            audit_record(tenant=tenant, actor=by, action=DONE[action], target=f"run:{run_id}",
                         via="console", stuck=stuck.kind, **detail)
            report.done.append(run_id)
    return report


def _run_act_if_stuck(action: str, run_id: UUID, by: str):
    """(how it was stuck, what was done) if the run is still stuck under its row's lock, else
    (None, {}): a worker that took the run over since the page was read (or the first of two
    submissions of one confirmation) holds it, and the run is left to it."""
    with transaction.atomic():
        if action != "cancel":  # a cancel locks its run's tree itself, children first (0008),
            # and decides under those locks whether a live worker holds the run
            Run.objects.select_for_update().filter(id=run_id).first()
        [stuck] = stuck_runs_here(run_ids=[run_id]) or [None]
        if stuck is None:
            return None, {}
        return stuck, _run_act(action, run_id, by)


def _run_act(action: str, run_id: UUID, by: str) -> dict:
    if action == "requeue":
        run_requeue(run_id=run_id, by=by)
        return {}
    if action == "cancel":
        run_cancel(run_id=run_id, by=by)
        return {}
    with transaction.atomic():  # the version is chosen and pinned against one read of the run
        run = Run.objects.select_for_update().get(id=run_id)
        version = migrate_target(run=run)
        run_migrate(run_id=run_id, version=version, by=by)
    return {"from_version": run.agent_version, "to_version": version}


def tenant_changed_record(*, user, tenant: Tenant, changed: dict, path: str) -> None:
    """A founder saved the tenant's form (status, in-flight cap, ...): `changed` maps each
    changed field to its new value."""
    console_access_record(user=user, tenant=tenant, view="tenant_action:change", path=path)
    audit_record(tenant=tenant, actor=actor_of(user), action="tenant.changed",
                 target=f"tenant:{tenant}", via="console", changed=changed)


def tenant_act(*, user, tenant: Tenant, action: str, path: str) -> None:
    """Suspend or reactivate the tenant (tenant_reactivate refuses a tenant being deleted)."""
    verbs = {"suspend": (tenant_services.tenant_suspend, "tenant.suspended"),
             "reactivate": (tenant_services.tenant_reactivate, "tenant.reactivated")}
    if action not in verbs:
        raise ConsoleError("unknown_action", f"unknown action {action!r}")
    verb, done = verbs[action]
    console_access_record(user=user, tenant=tenant, view=f"tenant_action:{action}", path=path)
    before = tenant.status
    verb(tenant=tenant)
    audit_record(tenant=tenant, actor=actor_of(user), action=done, target=f"tenant:{tenant}",
                 via="console", status_before=before, status=tenant.status)
