"""Operators' view of the outbox: a tenant's messages (chosen as in the runs console), and the
ones of unknown outcome for a person to settle: delivered, or send again (each settle goes to the
tenant's audit log as `outbox.settled`, as every founder action does)."""

from django.contrib import admin, messages
from django.shortcuts import redirect
from django.urls import path

from runs.admin import SESSION_KEY, tenant_chosen, tenant_scoped
from tenants.people import audit_record
from tenants.selectors import tenants_visible_to

from . import services
from .models import OutboxMessage


@admin.register(OutboxMessage)
class OutboxMessageAdmin(admin.ModelAdmin):
    list_display = ("id", "run", "name", "connector", "status", "attempts", "claimed_by",
                    "claimed_until", "last_error", "settled_by", "created_at")
    list_filter = ("status", "connector")
    search_fields = ("name", "idempotency_key", "run__id")
    ordering = ("-created_at",)
    readonly_fields = [f.name for f in OutboxMessage._meta.fields]
    actions = ["settle_delivered", "settle_send_again"]
    change_list_template = "admin/effects/outboxmessage/change_list.html"

    def get_urls(self):
        urls = super().get_urls()
        for pattern in urls:
            pattern.callback = tenant_scoped(pattern.callback, name=pattern.name or "")
        choose = path("tenant/<str:schema>/", self.admin_site.admin_view(self.choose_tenant),
                      name="effects_outboxmessage_choose_tenant")
        return [choose, *urls]

    def choose_tenant(self, request, schema):
        request.session[SESSION_KEY] = tenant_chosen(request, schema).schema_name
        return redirect("admin:effects_outboxmessage_changelist")

    def changelist_view(self, request, extra_context=None):
        extra = {"tenants": tenants_visible_to(user=request.user),
                 "current_tenant": request.admin_tenant,
                 "title": f"Outbox of tenant {request.admin_tenant.schema_name}"}
        return super().changelist_view(request, {**(extra_context or {}), **extra})

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def _settle(self, request, queryset, *, delivered: bool):
        if request.POST.get("tenant") != request.admin_tenant.schema_name:
            messages.error(request, "The tenant changed since this page was shown (another "
                           "tab?): nothing was settled. Check the list and try again.")
            return
        done = 0
        for message in queryset:
            try:
                services.outbox_settle(message_id=message.id, delivered=delivered,
                                       by=f"admin:{request.user.username}")
                audit_record(tenant=request.admin_tenant, actor=f"admin:{request.user.username}",
                             action="outbox.settled", target=f"outbox:{message.id}",
                             via="console", delivered=delivered)
                done += 1
            except services.OutboxError as exc:
                messages.warning(request, f"{message.id}: {exc.message}")
        messages.success(request, f"Settled {done} message(s).")

    @admin.action(description="Outcome unknown: it was delivered", permissions=["change"])
    def settle_delivered(self, request, queryset):
        self._settle(request, queryset, delivered=True)

    @admin.action(description="Outcome unknown: send it again", permissions=["change"])
    def settle_send_again(self, request, queryset):
        self._settle(request, queryset, delivered=False)
