from django.apps import AppConfig


class UsageConfig(AppConfig):
    name = "runs.usage"
    label = "usage"
    verbose_name = "Usage and quotas"
