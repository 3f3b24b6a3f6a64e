"""The agents shipped with the platform. Importing this package registers them."""

from . import onboarding, research  # noqa: F401
