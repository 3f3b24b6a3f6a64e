from django.apps import AppConfig


class DispatchConfig(AppConfig):
    name = "runs.dispatch"
    label = "dispatch"  # the label, and so every table and migration, did not move
