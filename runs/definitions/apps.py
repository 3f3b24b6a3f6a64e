from django.apps import AppConfig


class DefinitionsConfig(AppConfig):
    name = "runs.definitions"
    label = "definitions"
    verbose_name = "Tenant-defined agents"
