"""Sending the platform's own emails (invitations, password resets) to the test SMTP server
(tests.support.fakes.smtp) through Django's real SMTP backend, and reading links out of them."""

import re

from django.test import override_settings


def smtp_to(server, **settings):
    """Django's SMTP backend pointed at `server` (pytest-django otherwise keeps mail in memory)."""
    return override_settings(EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend",
                             EMAIL_HOST=server.host, EMAIL_PORT=server.port, EMAIL_USE_TLS=False,
                             EMAIL_USE_SSL=False, EMAIL_HOST_USER="", EMAIL_HOST_PASSWORD="",
                             **settings)


def text_of(message) -> str:
    return message.get_body(preferencelist=("plain",)).get_content()


def link_in(message, base: str = "http://testserver") -> str:
    """The first link to `base` in the message's text, as a path for the test client."""
    found = re.search(re.escape(base) + r"(/\S*)", text_of(message))
    assert found, text_of(message)
    return found.group(1)
