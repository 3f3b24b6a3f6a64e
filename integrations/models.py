"""Per-tenant connector credentials, sealed with the tenant's data key (see services.py)."""

from django.db import models


class Credential(models.Model):
    """One connector's secrets for this tenant (e.g. a Slack bot token), under a label."""

    connector = models.CharField(max_length=50)
    label = models.CharField(max_length=100, default="default")
    # nonce (12 bytes) + AES-256-GCM ciphertext and tag of the JSON secrets.
    ciphertext = models.BinaryField()
    key_version = models.PositiveIntegerField()  # which of the tenant's data keys sealed it
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["connector", "label"], name="credential_connector_label_unique")
        ]

    def __str__(self) -> str:
        return f"{self.connector}/{self.label}"
