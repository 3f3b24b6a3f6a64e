"""Founders' console (public schema): tenants with plan, status, members, key counts, usage this
month against quotas and last activity; suspend/reactivate (change permission on Tenant, audited
by runs.console.services); a tenant's page with its runs by status, its stuck runs, its archive
state; the read-only log of staff looking into tenants' runs.

A tenant marked superusers_only is read-only for other staff: listed (without its usage and last
activity), but not changed (status, max_in_flight, the actions), its API keys not shown, its
entries of the access log not shown."""

from django.contrib import admin, messages
from django.db.models import Count, Q
from django.utils.html import format_html_join
from django.utils.safestring import mark_safe

from runs.console import selectors as console
from runs.console import services as console_services
from runs.usage.quotas import tenant_plan

from . import services
from .models import ApiKey, ConsoleAccess, Tenant
from .selectors import tenants_visible_to
from .services import console_access_record


def _restricted_for(request, tenant) -> bool:
    return tenant is not None and tenant.superusers_only and not request.user.is_superuser


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    fields = ("name", "prefix", "scopes", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False  # keys are made by `create_api_key`, which shows the plaintext once


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("schema_name", "name", "plan", "status", "members", "active_keys",
                    "usage_this_month", "last_activity", "created_at")
    list_filter = ("status",)
    search_fields = ("schema_name", "name")
    readonly_fields = ("schema_name", "created_at", "provisioned_at")
    fields = ("schema_name", "name", "status", "max_in_flight", "superusers_only", "created_at",
              "provisioned_at")
    inlines = [ApiKeyInline]
    actions = ["suspend", "reactivate"]
    change_form_template = "admin/tenants/tenant/console_change_form.html"

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            key_count=Count("api_keys", filter=Q(api_keys__revoked_at=None), distinct=True),
            member_count=Count("memberships", distinct=True),
        )

    @admin.display(description="active API keys", ordering="key_count")
    def active_keys(self, obj):
        return obj.key_count

    @admin.display(description="members", ordering="member_count")
    def members(self, obj):
        return obj.member_count

    @admin.display(description="plan")
    def plan(self, obj):
        plan = tenant_plan(tenant=obj)
        return plan.name if plan is not None else "—"

    @admin.display(description="usage this month")
    def usage_this_month(self, obj):
        lines = console.tenant_usage(tenant=obj)
        if lines is None:
            return "—"
        return format_html_join(mark_safe("<br>"), "{}{}: {} / {}", (
            ("⚠ " if (line.share or 0) >= 0.9 else "", line.name, _amount(line.used),
             "∞" if line.limit is None else _amount(line.limit)) for line in lines)) or "—"

    @admin.display(description="last activity")
    def last_activity(self, obj):
        return console.tenant_last_activity(tenant=obj) or "—"

    def get_list_display(self, request):
        """Staff who are not superusers see a superusers_only tenant listed, as the tenant's page
        shows it: without its usage and activity (a look into what it does)."""
        if request.user.is_superuser:
            return self.list_display
        return tuple(_hidden_when_restricted(getattr(self, name))
                     if name in ("usage_this_month", "last_activity") else name
                     for name in self.list_display)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The tenant's page: its form, and below it its runs by status, stuck runs, archive
        state and usage (not for staff a superusers_only tenant is hidden from). The runs it
        names (stuck, last archive failure) are written to the access log (view `tenant_page`)."""
        tenant = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if request.method == "GET" and tenant is not None and not _restricted_for(request, tenant):
            overview = console.tenant_overview(tenant=tenant)
            extra.update(overview=overview, run_statuses=list(overview.runs_by_status.items()))
            failure = (overview.archive or {}).get("last_failure")
            shown = [s.run_id for s in overview.stuck] + ([failure["run_id"]] if failure else [])
            if shown:  # runs named on the page: a look into the tenant's runs
                console_access_record(user=request.user, tenant=tenant, view="tenant_page",
                                      path=request.get_full_path(), run_ids=shown)
        return super().change_view(request, object_id, form_url, extra)

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change and form.changed_data:
            console_services.tenant_changed_record(
                user=request.user, tenant=obj, path=request.get_full_path(),
                changed={name: form.cleaned_data[name] for name in form.changed_data})

    def has_change_permission(self, request, obj=None):
        return not _restricted_for(request, obj) and super().has_change_permission(request, obj)

    def get_inlines(self, request, obj):
        return [] if _restricted_for(request, obj) else super().get_inlines(request, obj)

    def _changeable(self, request, queryset):
        return queryset.filter(pk__in=tenants_visible_to(user=request.user).values("pk"))

    def get_readonly_fields(self, request, obj=None):
        fields = self.readonly_fields
        if obj is not None and obj.status == Tenant.Status.DELETING:
            fields = (*fields, "status")  # half deleted: only `delete_tenant` moves it on
        if request.user.is_superuser:
            return fields
        return (*fields, "superusers_only")  # staff cannot let themselves in

    def has_add_permission(self, request):
        return False  # provisioning migrates a schema: `manage.py create_tenant`

    def has_delete_permission(self, request, obj=None):
        return False  # deletion drops a schema: `manage.py delete_tenant`, explicitly

    @admin.action(description="Suspend selected tenants (API access stops)", permissions=["change"])
    def suspend(self, request, queryset):
        queryset = self._changeable(request, queryset)
        for tenant in queryset:
            console_services.tenant_act(user=request.user, tenant=tenant, action="suspend",
                                        path=request.get_full_path())
        messages.success(request, f"Suspended {queryset.count()} tenant(s).")

    @admin.action(description="Reactivate selected tenants", permissions=["change"])
    def reactivate(self, request, queryset):
        reactivated = 0
        for tenant in self._changeable(request, queryset):
            try:
                console_services.tenant_act(user=request.user, tenant=tenant,
                                            action="reactivate", path=request.get_full_path())
            except services.TenantError as exc:
                messages.error(request, str(exc))
                continue
            reactivated += 1
        messages.success(request, f"Reactivated {reactivated} tenant(s).")


def _hidden_when_restricted(column):
    """The list column, "—" for a superusers_only tenant (the list shows it to other staff)."""
    def shown(obj):
        return "—" if obj.superusers_only else column(obj)
    shown.__name__ = column.__name__  # the column keeps its name, header and CSS class
    shown.short_description = column.short_description
    return shown


def _amount(value: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:g}"


@admin.register(ConsoleAccess)
class ConsoleAccessAdmin(admin.ModelAdmin):
    """Who looked at which tenant's runs, when: read-only (the table refuses UPDATE and DELETE)."""

    list_display = ("at", "username", "tenant_schema", "view", "run_id", "path")
    list_filter = ("tenant_schema", "view")
    search_fields = ("username", "tenant_schema", "run_id")
    date_hierarchy = "at"

    def get_queryset(self, request):
        # rows of tenants the user may see (a deleted tenant's rows: superusers only)
        rows = super().get_queryset(request)
        if request.user.is_superuser:
            return rows
        return rows.filter(tenant_schema__in=tenants_visible_to(user=request.user)
                           .values("schema_name"))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
