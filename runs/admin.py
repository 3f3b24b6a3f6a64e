"""Founders' view of runs: runs live in tenant schemas, so the console picks a tenant first
(kept in the session) and every view of this admin runs inside that tenant's schema.

Every look into a tenant's runs is written to the access log (tenants.ConsoleAccess) before the
schema is switched, and every action done to a run to the tenant's audit log (AuditEntry, actor
`admin:<username>`, as runs.console.services does); a tenant marked superusers_only is a 404
for other staff."""

import uuid
from functools import wraps

from django import forms
from django.contrib import admin, messages
from django.http import Http404
from django.shortcuts import redirect
from django.urls import path
from django_tenants.utils import tenant_context

from tenants.models import Tenant
from tenants.people import audit_record
from tenants.selectors import tenants_visible_to
from tenants.services import console_access_record

from . import services
from .agents import UnknownAgent, registry
from .models import Run

SESSION_KEY = "admin_runs_tenant"


def _run_id(value) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def _access_of(request, name: str, kwargs) -> tuple[str, list[uuid.UUID | None]]:
    """What this request looks at: the view ("run_changelist", "run_change", "run_action:requeue"
    ...) and the runs (or outbox messages' runs) it names. An action on "all N matching"
    (select_across=1) acts on every row the changelist's filters match, whatever ids were
    ticked: one row, run_id empty, view "run_action_all:<action>", the filters in its path."""
    view = name.partition("_")[2] or "view"  # "runs_run_change" -> "run_change"
    if request.method == "POST" and request.POST.get("action"):
        model, action = view.rsplit("_", 1)[0], request.POST["action"]
        if forms.BooleanField().to_python(request.POST.get("select_across")):  # as ActionForm reads it
            return f"{model}_action_all:{action}", [None]
        selected = [_run_id(value) for value in request.POST.getlist("_selected_action")]
        return f"{model}_action:{action}", selected or [None]
    object_id = kwargs.get("object_id")
    return view, [_run_id(object_id) if object_id else None]


def tenant_chosen(request, schema: str) -> Tenant:
    """The tenant a staff member asked for, if they may see it; 404 otherwise."""
    tenant = tenants_visible_to(user=request.user).filter(schema_name=schema).first()
    if tenant is None:
        raise Http404("No such tenant.")
    return tenant


def tenant_scoped(view, *, name: str = ""):
    @wraps(view)
    def in_tenant(request, *args, **kwargs):
        if not (request.user.is_active and request.user.is_staff):
            return view(request, *args, **kwargs)  # the admin sends them to its login page
        schema = request.session.get(SESSION_KEY)
        tenant = Tenant.objects.filter(schema_name=schema).first() if schema else None
        if tenant is None:
            tenant = tenants_visible_to(user=request.user).first()
            if tenant is None:
                messages.warning(request, "No tenants yet.")
                return redirect("admin:index")
            request.session[SESSION_KEY] = tenant.schema_name
        if tenant.superusers_only and not request.user.is_superuser:
            raise Http404("No such tenant.")
        request.admin_tenant = tenant
        view_name, run_ids = _access_of(request, name, kwargs)
        console_access_record(user=request.user, tenant=tenant, view=view_name,
                              path=request.get_full_path(), run_ids=run_ids)
        with tenant_context(tenant):
            response = view(request, *args, **kwargs)
            if hasattr(response, "render"):  # template responses render lazily: do it here
                response.render()
            return response

    return in_tenant


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "agent", "agent_version", "status", "steps_taken", "lease_owner",
                    "lease_epoch", "lease_expires_at", "updated_at")
    list_filter = ("status", "agent")
    search_fields = ("id", "agent")
    ordering = ("-created_at",)
    readonly_fields = [f.name for f in Run._meta.fields]
    actions = ["requeue", "migrate", "cancel"]
    change_list_template = "admin/runs/run/change_list.html"

    def get_urls(self):
        urls = super().get_urls()
        for pattern in urls:
            pattern.callback = tenant_scoped(pattern.callback, name=pattern.name or "")
        choose = path("tenant/<str:schema>/", self.admin_site.admin_view(self.choose_tenant),
                      name="runs_run_choose_tenant")
        return [choose, *urls]

    def choose_tenant(self, request, schema):
        """Choose the tenant; `?run=<id>` goes on to that run's page (links from the console)."""
        request.session[SESSION_KEY] = tenant_chosen(request, schema).schema_name
        run_id = _run_id(request.GET.get("run", ""))
        if run_id is not None:
            return redirect("admin:runs_run_change", run_id)
        return redirect("admin:runs_run_changelist")

    def changelist_view(self, request, extra_context=None):
        extra = {"tenants": tenants_visible_to(user=request.user),
                 "current_tenant": request.admin_tenant,
                 "title": f"Runs of tenant {request.admin_tenant.schema_name}"}
        return super().changelist_view(request, {**(extra_context or {}), **extra})

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # history is deleted only by retention, after it is archived

    def _audit(self, request, action: str, run_id, **detail) -> None:
        audit_record(tenant=request.admin_tenant, actor=f"admin:{request.user.username}",
                     action=action, target=f"run:{run_id}", via="console", **detail)

    @admin.action(description="Re-queue selected runs (fences off the current holder)",
                  permissions=["change"])
    def requeue(self, request, queryset):
        done, refused = 0, []
        for run in queryset:
            try:
                services.run_requeue(run_id=run.id, by=f"admin:{request.user.username}")
                self._audit(request, "run.requeued", run.id)
                done += 1
            except services.RunError as exc:
                refused.append(f"{run.id}: {exc.message}")
        messages.success(request, f"Re-queued {done} run(s).")
        for line in refused:
            messages.warning(request, line)

    @admin.action(description="Migrate selected runs to their agent's newest version",
                  permissions=["change"])
    def migrate(self, request, queryset):
        done, refused = 0, []
        for run in queryset:
            try:
                newest = registry.get(run.agent).version
                services.run_migrate(run_id=run.id, version=newest,
                                     by=f"admin:{request.user.username}")
                self._audit(request, "run.migrated", run.id, from_version=run.agent_version,
                            to_version=newest)
                done += 1
            except UnknownAgent as exc:
                refused.append(f"{run.id}: {exc}")
            except services.RunError as exc:
                refused.append(f"{run.id}: {exc.message}")
        messages.success(request, f"Migrated {done} run(s).")
        for line in refused:
            messages.warning(request, line)

    @admin.action(description="Cancel selected runs", permissions=["change"])
    def cancel(self, request, queryset):
        for run in queryset:
            try:
                services.run_cancel(run_id=run.id, by=f"admin:{request.user.username}")
            except services.RunError as exc:
                messages.warning(request, f"{run.id}: {exc.message}")
                continue
            self._audit(request, "run.cancel_requested", run.id)
        messages.success(request, "Cancel requested.")
