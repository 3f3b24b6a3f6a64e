from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "runs.console"
    label = "console"
    verbose_name = "founders' console"
