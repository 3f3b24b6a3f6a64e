"""Email over SMTP through Django's mail backend.

args: to (address or list), subject, body, from (optional).
credentials (optional, else EMAIL_* settings): host, port, username, password, use_tls, use_ssl,
from (the default sender). Strings, a number for port, booleans for use_tls/use_ssl
(`credential_problem`, checked when the credential is stored and again here): with a tenant's
host, nothing comes from the EMAIL_* settings, not the relay's login nor its client certificate.
result: {"message_id": "<...>", "recipients": [...]}.

The whole SMTP conversation (connect, TLS, every command and reply) has one deadline,
CONNECTOR_TIMEOUT_SECONDS, like an HTTP call (transport.Deadline).

Plain SMTP cannot be asked whether a message arrived, so the key travels in the message
(`X-Idempotency-Key`, and a Message-ID derived from it) for a receiver or a person to spot a
duplicate, and `lookup` answers UNKNOWN.
"""

import hashlib
import io
import smtplib
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.core.mail.backends.smtp import EmailBackend
from django.core.mail.message import sanitize_address

from .base import Call, Connector, ConnectorError, connector_register
from .transport import Deadline, DeadlineReader, Destination, destination_resolve

REPLIES_MAX_BYTES = 1024 * 1024  # all the server's replies in one conversation
CREDENTIAL_BOOLEANS = ("use_tls", "use_ssl")


def message_id_for(idempotency_key: str) -> str:
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:40]
    return f"<{digest}@{settings.EMAIL_MESSAGE_ID_DOMAIN}>"


class EmailConnector(Connector):
    name = "email"
    honours_idempotency_key = False
    credential_strings = ("host", "username", "password", "from")

    def credential_problem(self, secrets: dict[str, Any]) -> str:
        problem = super().credential_problem(secrets)
        if problem:
            return problem
        for field in CREDENTIAL_BOOLEANS:
            if field in secrets and not isinstance(secrets[field], bool):
                return f"{field!r} must be true or false"
        port = secrets.get("port", 587)
        if isinstance(port, bool) or not (isinstance(port, int) or isinstance(port, str)
                                          and port.isdigit()):
            return "'port' must be a number"
        if secrets.get("use_tls") and secrets.get("use_ssl"):
            return "'use_tls' and 'use_ssl' cannot both be true"
        return ""

    def execute(self, call: Call) -> dict[str, Any]:
        deadline = Deadline(settings.CONNECTOR_TIMEOUT_SECONDS)
        args, creds = call.args, call.credentials
        to = args.get("to")
        recipients = [to] if isinstance(to, str) else list(to or [])
        if not recipients or not all(isinstance(r, str) and "@" in r for r in recipients):
            raise ConnectorError("email: 'to' must be an address or a list of addresses", retryable=False)
        for field in ("subject", "body"):
            if not isinstance(args.get(field), str):
                raise ConnectorError(f"email: {field!r} must be a string", retryable=False)
        if not isinstance(args.get("from") or "", str):
            raise ConnectorError("email: 'from' must be an address", retryable=False)
        message_id = message_id_for(call.idempotency_key)
        if creds.get("host"):  # the tenant's own server: its values only, never ours
            problem = self.credential_problem(creds)
            if problem:  # stored before the check existed: refuse rather than fall back on ours
                raise ConnectorError(f"email: the tenant's email credential is invalid: {problem}",
                                     retryable=False)
            port = int(creds.get("port", 587))
            destination = destination_resolve(creds["host"], port, receiver="email",
                                              ports=settings.CONNECTOR_SMTP_PORTS)
            # every value explicit: Django's backend takes EMAIL_* settings for a None
            smtp = {"host": destination.host, "port": port,
                    "username": creds.get("username", ""), "password": creds.get("password", ""),
                    "use_tls": creds.get("use_tls", False), "use_ssl": creds.get("use_ssl", False),
                    "ssl_certfile": "", "ssl_keyfile": ""}
            sender, reply_to = args.get("from") or creds.get("from") or settings.DEFAULT_FROM_EMAIL, []
        else:  # the platform's relay: its login never goes elsewhere, and it sends as itself
            destination = destination_resolve(settings.EMAIL_HOST, settings.EMAIL_PORT,
                                              receiver="email", ports=(), operator=True)
            smtp = {"host": settings.EMAIL_HOST, "port": settings.EMAIL_PORT,
                    "username": settings.EMAIL_HOST_USER, "password": settings.EMAIL_HOST_PASSWORD,
                    "use_tls": settings.EMAIL_USE_TLS, "use_ssl": settings.EMAIL_USE_SSL}
            sender = settings.DEFAULT_FROM_EMAIL
            # the tenant's address (the call's, else its credential's) is where answers go
            tenant_from = args.get("from") or creds.get("from")
            reply_to = [tenant_from] if tenant_from else []
        backend = PinnedEmailBackend(destination=destination, deadline=deadline,
                                     fail_silently=False, timeout=deadline.seconds, **smtp)
        message = EmailMessage(
            subject=args["subject"], body=args["body"], to=recipients, from_email=sender,
            reply_to=reply_to, connection=backend,
            headers={"Message-ID": message_id, "X-Idempotency-Key": call.idempotency_key},
        )
        try:  # what Django would refuse halfway through the conversation, refused before it
            message.message()  # a line break in a header: BadHeaderError
            for address in [sender, *recipients, *reply_to]:
                sanitize_address(address, message.encoding or settings.DEFAULT_CHARSET)
        except ValueError:
            raise ConnectorError("email: the subject or an address holds a line break or is not "
                                 "a valid address", retryable=False, sent=False) from None
        try:
            backend.open()  # a failure here means the server saw no message: safe to send again
        except smtplib.SMTPAuthenticationError as exc:
            raise ConnectorError(f"email: SMTP authentication failed ({exc.smtp_code})",
                                 retryable=False) from None
        except (smtplib.SMTPException, OSError) as exc:
            raise ConnectorError(f"email: cannot open an SMTP session: {_reason(exc)}",
                                 retryable=True, sent=False) from None
        try:
            backend.send_messages([message])
        except smtplib.SMTPRecipientsRefused as exc:
            raise ConnectorError(f"email: recipients refused: {sorted(exc.recipients)}",
                                 retryable=False) from None
        except smtplib.SMTPResponseException as exc:
            # 4xx: the server declined for now; 5xx: for good. Either way it did not take it.
            raise ConnectorError(f"email: SMTP server said {exc.smtp_code} {_text(exc.smtp_error)}",
                                 retryable=400 <= exc.smtp_code < 500) from None
        except (smtplib.SMTPException, OSError) as exc:
            raise ConnectorError(
                f"email: the SMTP conversation broke off ({_reason(exc)}); the message may have "
                "been delivered", retryable=True, sent=True) from None
        finally:
            try:
                backend.close()
            except (smtplib.SMTPException, OSError):
                pass  # the message was handed over (or the error above says why not)
        return {"message_id": message_id, "recipients": recipients}


class PinnedEmailBackend(EmailBackend):
    """Django's SMTP backend, connecting to the destination's checked address only; the name
    stays the TLS server_hostname (SMTPS and STARTTLS), so certificates are checked against it.
    Every send and every reply waits only for the time the call's deadline has left."""

    def __init__(self, *, destination: Destination, deadline: Deadline, **kwargs):
        super().__init__(**kwargs)
        self.destination, self.deadline = destination, deadline

    @property
    def connection_class(self):
        destination, deadline = self.destination, self.deadline

        class PinnedSMTP(smtplib.SMTP_SSL if self.use_ssl else smtplib.SMTP):
            def _get_socket(self, host, port, timeout):
                sock = destination.connect(deadline)
                if isinstance(self, smtplib.SMTP_SSL):  # self._host is the name given, not the IP
                    sock = self.context.wrap_socket(sock, server_hostname=self._host)
                return sock

            def send(self, s):
                if self.sock:
                    self.sock.settimeout(deadline.left())
                super().send(s)

            def getreply(self):
                if self.file is None and self.sock:  # again after STARTTLS, over the TLS socket
                    self.file = io.BufferedReader(
                        DeadlineReader(self.sock, deadline, REPLIES_MAX_BYTES))
                return super().getreply()

        return PinnedSMTP


def _reason(exc: BaseException) -> str:
    return "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


connector_register(EmailConnector())
