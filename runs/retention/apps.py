from django.apps import AppConfig


class RetentionConfig(AppConfig):
    name = "runs.retention"
    label = "retention"  # the label, and so every table and migration, did not move
