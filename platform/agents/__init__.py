"""The agents shipped with the platform. Importing this package registers them."""

from . import invoice_graph, onboarding, research  # noqa: F401
