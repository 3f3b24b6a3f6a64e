from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"

    def ready(self):
        # Agent modules register agents (and may register connectors): every process that
        # runs steps or delivers effects needs them, so they load with the app registry.
        from agentplatform.telemetry import telemetry_setup

        from .agents import registry

        registry.load()
        telemetry_setup()
