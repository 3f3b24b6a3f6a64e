from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"

    def ready(self):
        from approvals.services import ANNOUNCERS

        from .slack_approvals import slack_approval_announce

        if slack_approval_announce not in ANNOUNCERS:
            ANNOUNCERS.append(slack_approval_announce)
