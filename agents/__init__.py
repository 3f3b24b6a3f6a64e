"""The agents shipped with the platform. Importing this package registers them."""

from . import research  # noqa: F401
