from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"

    def ready(self):
        # Agent modules are loaded by the composition root (agentplatform.apps), once wired.
        from agentplatform.telemetry import telemetry_setup

        telemetry_setup()
