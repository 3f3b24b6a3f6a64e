"""Founders' view of runs: runs live in tenant schemas, so the console picks a tenant first
(kept in the session) and every view of this admin runs inside that tenant's schema."""

from functools import wraps

from django.contrib import admin, messages
from django.shortcuts import redirect
from django.urls import path
from django_tenants.utils import tenant_context

from tenants.models import Tenant

from . import services
from .agents import UnknownAgent, registry
from .models import Run

SESSION_KEY = "admin_runs_tenant"


def tenant_scoped(view):
    @wraps(view)
    def in_tenant(request, *args, **kwargs):
        if not (request.user.is_active and request.user.is_staff):
            return view(request, *args, **kwargs)  # the admin sends them to its login page
        schema = request.session.get(SESSION_KEY)
        tenant = Tenant.objects.filter(schema_name=schema).first() if schema else None
        if tenant is None:
            tenant = Tenant.objects.order_by("schema_name").first()
            if tenant is None:
                messages.warning(request, "No tenants yet.")
                return redirect("admin:index")
            request.session[SESSION_KEY] = tenant.schema_name
        request.admin_tenant = tenant
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
            pattern.callback = tenant_scoped(pattern.callback)
        choose = path("tenant/<str:schema>/", self.admin_site.admin_view(self.choose_tenant),
                      name="runs_run_choose_tenant")
        return [choose, *urls]

    def choose_tenant(self, request, schema):
        if Tenant.objects.filter(schema_name=schema).exists():
            request.session[SESSION_KEY] = schema
        return redirect("admin:runs_run_changelist")

    def changelist_view(self, request, extra_context=None):
        extra = {"tenants": Tenant.objects.order_by("schema_name"),
                 "current_tenant": request.admin_tenant,
                 "title": f"Runs of tenant {request.admin_tenant.schema_name}"}
        return super().changelist_view(request, {**(extra_context or {}), **extra})

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # history is deleted only by retention, after it is archived

    @admin.action(description="Re-queue selected runs (fences off the current holder)",
                  permissions=["change"])
    def requeue(self, request, queryset):
        done, refused = 0, []
        for run in queryset:
            try:
                services.run_requeue(run_id=run.id, by=f"admin:{request.user.username}")
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
                services.run_cancel(run_id=run.id)
            except services.RunError as exc:
                messages.warning(request, f"{run.id}: {exc.message}")
        messages.success(request, "Cancel requested.")
