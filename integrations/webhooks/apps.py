from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "integrations.webhooks"
    label = "webhooks"  # the label, and so every table and migration, did not move

    def ready(self):
        from runs.approvals.services import ANNOUNCERS

        from .slack_approvals import slack_approval_announce

        if slack_approval_announce not in ANNOUNCERS:
            ANNOUNCERS.append(slack_approval_announce)
