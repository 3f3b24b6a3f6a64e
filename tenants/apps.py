"""The tenants app. django-tenants drops a deleted tenant's schema from a post_delete receiver
connected for every model; a receiver for every model also turns off Django's fast delete
everywhere (each `QuerySet.delete()` first SELECTs every row it deletes, JSON and all, to hand
each to the signal). Here the receiver listens to the tenant model only: the same drop, and
deletes elsewhere are one DELETE again."""

from django.apps import AppConfig
from django.db.models.signals import post_delete
from django_tenants.signals import tenant_delete_callback


class TenantsConfig(AppConfig):
    name = "tenants"

    def ready(self):
        tenant = self.get_model("Tenant")
        post_delete.disconnect(tenant_delete_callback)
        post_delete.connect(tenant_delete_callback, sender=tenant,
                            dispatch_uid="tenants.tenant_delete_callback")
