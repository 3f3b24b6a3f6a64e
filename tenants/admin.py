"""Founders' console (public schema): tenants with status and key counts, suspend/reactivate
(change permission on Tenant); the read-only log of staff looking into tenants' runs.

A tenant marked superusers_only is read-only for other staff: listed, but not changed (status,
max_in_flight, the actions), its API keys not shown, its entries of the access log not shown."""

from django.contrib import admin, messages
from django.db.models import Count, Q

from . import services
from .models import ApiKey, ConsoleAccess, Tenant
from .selectors import tenants_visible_to


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
    list_display = ("schema_name", "name", "status", "active_keys", "created_at")
    list_filter = ("status",)
    search_fields = ("schema_name", "name")
    readonly_fields = ("schema_name", "created_at", "provisioned_at")
    fields = ("schema_name", "name", "status", "max_in_flight", "superusers_only", "created_at",
              "provisioned_at")
    inlines = [ApiKeyInline]
    actions = ["suspend", "reactivate"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            key_count=Count("api_keys", filter=Q(api_keys__revoked_at=None))
        )

    @admin.display(description="active API keys", ordering="key_count")
    def active_keys(self, obj):
        return obj.key_count

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
            services.tenant_suspend(tenant=tenant)
        messages.success(request, f"Suspended {queryset.count()} tenant(s).")

    @admin.action(description="Reactivate selected tenants", permissions=["change"])
    def reactivate(self, request, queryset):
        reactivated = 0
        for tenant in self._changeable(request, queryset):
            try:
                services.tenant_reactivate(tenant=tenant)
            except services.TenantError as exc:
                messages.error(request, str(exc))
                continue
            reactivated += 1
        messages.success(request, f"Reactivated {reactivated} tenant(s).")


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
