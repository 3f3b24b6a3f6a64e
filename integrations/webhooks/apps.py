from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "integrations.webhooks"
    label = "webhooks"  # the label, and so every table and migration, did not move

