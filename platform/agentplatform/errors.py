"""The one error contract of the services: `ServiceError(code, message)`.

Every error a service raises for its caller to answer subclasses it: `code` is stable and
machine-readable, `message` is for a person. Which HTTP status a code means is the API's
business (agentplatform/api_errors.py), not the service's. This module imports no app, so any
app can raise it without an import between apps.
"""


class ServiceError(Exception):
    """A service operation that cannot be done, with a stable `code` and a `message`."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message
