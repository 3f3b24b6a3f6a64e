from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "runs.approvals"
    label = "approvals"  # the label, and so every table and migration, did not move
