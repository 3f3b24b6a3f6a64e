from django.apps import AppConfig


class GraphsConfig(AppConfig):
    name = "runs.graphs"
    label = "graphs"
    verbose_name = "LangGraph checkpoints"
