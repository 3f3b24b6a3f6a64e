"""The tenants app. django-tenants drops a deleted tenant's schema from a post_delete receiver
connected for every model; a receiver for every model also turns off Django's fast delete
everywhere (each `QuerySet.delete()` first SELECTs every row it deletes, JSON and all, to hand
each to the signal). Here the receiver listens to the tenant model and its proxies only: the
same drop, and deletes elsewhere are one DELETE again."""

from django.apps import AppConfig, apps
from django.db.models.signals import post_delete
from django_tenants.signals import tenant_delete_callback


class TenantsConfig(AppConfig):
    name = "tenants"

    def ready(self):
        tenant = self.get_model("Tenant")
        post_delete.disconnect(tenant_delete_callback)
        # a delete through a proxy (the console's and retention's views of tenants) sends the
        # proxy as its sender: each listened to, so every way of deleting a tenant drops it
        for model in apps.get_models():
            if issubclass(model, tenant):
                post_delete.connect(tenant_delete_callback, sender=model,
                                    dispatch_uid=f"tenants.tenant_delete_callback:{model._meta.label}")
