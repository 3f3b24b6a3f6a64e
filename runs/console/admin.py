"""The founders' console pages across tenants: stuck runs (with re-queue, migrate and cancel, each
confirmed on a page that says how many runs it touches, then audited by runs.console.services)
and the fleet. Only the tenants the user may see are read (tenants_visible_to: a tenant marked
superusers_only is left out for other staff). Every stuck run shown is written to the console
access log (view `stuck_list`), as a look into that tenant's runs."""

from collections import defaultdict

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path

from tenants.selectors import tenants_visible_to
from tenants.services import console_access_record

from . import selectors, services
from .models import Fleet, StuckRuns


def _visible(request):
    return tenants_visible_to(user=request.user).exclude(provisioned_at=None)


class ConsolePage(admin.ModelAdmin):
    """A page of the console behind a proxy model's admin entry: no add, change or delete of
    the rows themselves; its own views."""

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def _context(self, request, **extra):
        return {**self.admin_site.each_context(request), "opts": self.model._meta,
                "has_change_permission": self.has_change_permission(request), **extra}


@admin.register(StuckRuns)
class StuckRunsAdmin(ConsolePage):
    def get_urls(self):
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", self.admin_site.admin_view(self.changelist_view), name=f"{name}_changelist"),
            path("confirm/", self.admin_site.admin_view(self.confirm_view), name=f"{name}_confirm"),
        ]

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        stuck = selectors.stuck_runs(tenants=_visible(request))
        kind = request.GET.get("kind")
        if kind in selectors.STUCK_KINDS:
            stuck = [s for s in stuck if s.kind == kind]
        _log_shown(request, stuck, view="stuck_list")
        counts = defaultdict(int)
        for s in stuck:
            counts[s.kind] += 1
        return TemplateResponse(request, "admin/console/stuck_runs.html", self._context(
            request, title="Stuck runs across tenants", stuck=stuck, kind=kind,
            kinds=[(key, label, counts[key]) for key, label in selectors.STUCK_KINDS.items()],
            actions=services.RUN_ACTIONS))

    def confirm_view(self, request):
        """POST from the list: a page that names the action and how many runs it touches. POST
        again with `confirmed`: done, then back to the list."""
        if not self.has_change_permission(request):
            raise PermissionDenied
        if request.method != "POST":
            return redirect("admin:console_stuckruns_changelist")
        action = request.POST.get("action", "")
        if action not in services.RUN_ACTIONS:
            messages.error(request, "Choose an action.")
            return redirect("admin:console_stuckruns_changelist")
        selected = selectors.stuck_keys_parse(request.POST.getlist("run"))
        tenants = {t.schema_name: t for t in _visible(request).filter(schema_name__in=selected)}
        chosen = {schema: ids for schema, ids in selected.items() if schema in tenants}
        if not chosen:
            messages.error(request, "Select at least one stuck run.")
            return redirect("admin:console_stuckruns_changelist")
        if not request.POST.get("confirmed"):
            still = [s for schema, ids in chosen.items() for s in selectors.in_schema(
                tenants[schema], lambda ids=ids: selectors.stuck_runs_here(run_ids=ids), [])]
            _log_shown(request, still, view="stuck_confirm")
            return TemplateResponse(request, "admin/console/stuck_confirm.html", self._context(
                request, title=f"{services.RUN_ACTIONS[action].capitalize()} {len(still)} "
                f"stuck run(s)?", action=action, action_label=services.RUN_ACTIONS[action],
                stuck=still, gone=sum(map(len, chosen.values())) - len(still)))
        done = refused = 0
        for schema, ids in chosen.items():
            report = services.stuck_runs_act(user=request.user, tenant=tenants[schema],
                                             action=action, run_ids=ids,
                                             path=request.get_full_path())
            done += len(report.done)
            refused += len(report.refused)
            for run_id, why in report.refused:
                messages.warning(request, f"{schema} run {run_id}: {why}")
        messages.success(request, f"{services.RUN_ACTIONS[action].capitalize()}: {done} run(s) "
                         f"done, {refused} refused.")
        return redirect("admin:console_stuckruns_changelist")


def _log_shown(request, stuck, *, view: str) -> None:
    by_tenant = defaultdict(list)
    for s in stuck:
        by_tenant[s.schema].append(s.run_id)
    tenants = {t.schema_name: t for t in _visible(request).filter(schema_name__in=by_tenant)}
    for schema, run_ids in by_tenant.items():
        console_access_record(user=request.user, tenant=tenants[schema], view=view,
                              path=request.get_full_path(), run_ids=run_ids)


@admin.register(Fleet)
class FleetAdmin(ConsolePage):
    def get_urls(self):
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        return [path("", self.admin_site.admin_view(self.changelist_view),
                     name=f"{name}_changelist")]

    def has_change_permission(self, request, obj=None):
        return False  # a page to read

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        fleet = selectors.fleet_summary(tenants=_visible(request))
        return TemplateResponse(request, "admin/console/fleet.html", self._context(
            request, title="Fleet", fleet=fleet,
            alive_within=selectors.heartbeat_alive_within()))
