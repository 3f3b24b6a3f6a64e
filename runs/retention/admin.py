"""Operators' console (public schema): archive status, sizes and failures per tenant, read-only.
Each row queries that tenant's schema. A tenant's last failure names one of its runs and the
archiver's error text: each one shown is written to the access log (tenants.ConsoleAccess,
view "archive_failure"), as a look into that tenant's runs."""

from django.contrib import admin
from django.db import DatabaseError
from django.template.defaultfilters import filesizeformat
from django_tenants.utils import schema_context

from tenants.selectors import tenants_visible_to
from tenants.services import console_access_record

from . import selectors
from .models import TenantArchives


@admin.register(TenantArchives)
class TenantArchivesAdmin(admin.ModelAdmin):
    list_display = ("schema_name", "status", "archived_runs", "archived_size", "discarded_runs",
                    "failing_runs", "last_failure", "last_archived_at")
    ordering = ("schema_name",)
    fields = ("schema_name", "status")
    readonly_fields = fields

    def get_queryset(self, request):
        # a superusers_only tenant's archive summary (its failures name runs) is theirs too
        visible = tenants_visible_to(user=request.user).values("pk")
        return super().get_queryset(request).filter(pk__in=visible)

    def changelist_view(self, request, extra_context=None):
        response = super().changelist_view(request, extra_context)
        changelist = getattr(response, "context_data", {}).get("cl")
        if changelist is None:  # a redirect, an error page: no tenant's failures shown
            return response
        response.render()  # the summaries are read while rendering: then log what was shown
        for tenant in changelist.result_list:
            failure = getattr(tenant, "_archive_summary", {}).get("last_failure")
            if failure:
                console_access_record(user=request.user, tenant=tenant, view="archive_failure",
                                      path=request.get_full_path(), run_ids=[failure["run_id"]])
        return response

    def _summary(self, obj) -> dict:
        if not hasattr(obj, "_archive_summary"):
            try:
                with schema_context(obj.schema_name):
                    obj._archive_summary = selectors.archive_summary()
            except DatabaseError:  # not provisioned, or not migrated yet
                obj._archive_summary = {}
        return obj._archive_summary

    @admin.display(description="archived runs")
    def archived_runs(self, obj):
        return self._summary(obj).get("archived", "—")

    @admin.display(description="archived size")
    def archived_size(self, obj):
        size = self._summary(obj).get("archived_bytes")
        return "—" if size is None else filesizeformat(size)

    @admin.display(description="pruned without archive")
    def discarded_runs(self, obj):
        return self._summary(obj).get("discarded", "—")

    @admin.display(description="failing runs")
    def failing_runs(self, obj):
        return self._summary(obj).get("failing", "—")

    @admin.display(description="last failure")
    def last_failure(self, obj):
        failure = self._summary(obj).get("last_failure")
        if not failure:
            return "—"
        return (f"{failure['updated_at']:%Y-%m-%d %H:%M} run {failure['run_id']} "
                f"(attempt {failure['attempts']}): {failure['error'][:200]}")

    @admin.display(description="last archived")
    def last_archived_at(self, obj):
        return self._summary(obj).get("last_archived_at") or "—"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
