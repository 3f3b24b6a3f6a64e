"""Connectors: one small module per receiver, one interface (see base.py).

`connector_get(name)` returns the registered connector; modules register themselves on import.
"""

from .base import Call, Connector, ConnectorError, Lookup, connector_get, connector_register

__all__ = ["Call", "Connector", "ConnectorError", "Lookup", "connector_get", "connector_register"]
