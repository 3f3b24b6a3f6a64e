from django.apps import AppConfig


class EffectsConfig(AppConfig):
    name = "runs.effects"
    label = "effects"  # the label, and so every table and migration, did not move
