"""Founders' console: plans and each tenant's plan and quota overrides (editable with the change
permission), and the metered days (read-only: they are recomputed from the tenants' rows).

A tenant marked superusers_only is read-only for other staff here too (as in tenants.admin): its
quota row is shown, not changed, and no new row can be made for it; its metered days are not
shown."""

from django.contrib import admin

from tenants.selectors import tenants_visible_to

from .models import QUOTA_FIELDS, Plan, TenantQuota, UsageDay


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = ("name", "is_default", *QUOTA_FIELDS)
    ordering = ("name",)
    search_fields = ("name",)


@admin.register(TenantQuota)
class TenantQuotaAdmin(admin.ModelAdmin):
    list_display = ("tenant", "plan", *QUOTA_FIELDS, "updated_at")
    list_select_related = ("tenant", "plan")
    autocomplete_fields = ()
    search_fields = ("tenant__schema_name", "tenant__name")
    fieldsets = (
        (None, {"fields": ("tenant", "plan")}),
        ("Overrides (empty: the plan's limit)", {"fields": QUOTA_FIELDS}),
    )

    def get_readonly_fields(self, request, obj=None):
        return ("tenant",) if obj is not None else ()

    def has_change_permission(self, request, obj=None):
        restricted = obj is not None and obj.tenant.superusers_only and not request.user.is_superuser
        return not restricted and super().has_change_permission(request, obj)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "tenant":  # a new row only for a tenant this person may change
            kwargs["queryset"] = tenants_visible_to(user=request.user)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


@admin.register(UsageDay)
class UsageDayAdmin(admin.ModelAdmin):
    list_display = ("tenant", "day", "runs_started", "steps", "tokens_in", "tokens_out",
                    "cost_usd", "sandbox_cpu_seconds", "hot_bytes", "archive_bytes",
                    "api_requests", "computed_at")
    list_filter = ("day",)
    search_fields = ("tenant__schema_name",)
    date_hierarchy = "day"
    ordering = ("-day", "tenant")

    def get_queryset(self, request):
        # a superusers_only tenant's days: superusers only (its usage is a look into its work)
        rows = super().get_queryset(request)
        if request.user.is_superuser:
            return rows
        return rows.filter(tenant__in=tenants_visible_to(user=request.user))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
