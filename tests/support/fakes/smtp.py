"""A real SMTP server for tests (aiosmtpd) that keeps what it receives.

`python -m tests.support.fakes.smtp --port N` runs one standalone, printing each message it gets.
"""

import argparse
import asyncio
import socket
import threading
import time
from email import message_from_bytes, policy
from email.message import EmailMessage

from aiosmtpd.controller import Controller


class Inbox:
    """aiosmtpd handler: accepts every message; `reject_next` answers that many with a 451."""

    def __init__(self):
        self.lock = threading.Lock()
        self.messages: list[EmailMessage] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        self.reject_next = 0
        self.hold_seconds = 0.0  # keep the sender waiting for its 250 after accepting

    async def handle_DATA(self, server, session, envelope):  # noqa: N802
        with self.lock:
            if self.reject_next > 0:
                self.reject_next -= 1
                return "451 4.3.0 try again later"
            self.messages.append(message_from_bytes(envelope.content, policy=policy.default))
            self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
            hold = self.hold_seconds
        if hold:
            await asyncio.sleep(hold)
        return "250 OK"

    def by_header(self, name: str, value: str) -> list[EmailMessage]:
        with self.lock:
            return [m for m in self.messages if m[name] == value]


class SMTPServer:
    def __init__(self, port: int = 0):
        self.inbox = Inbox()
        self.host, self.port = "127.0.0.1", port or free_port()
        self.controller = Controller(self.inbox, hostname=self.host, port=self.port)

    @property
    def messages(self) -> list[EmailMessage]:
        return self.inbox.messages

    def start(self) -> "SMTPServer":
        self.controller.start()
        return self

    def stop(self) -> None:
        self.controller.stop()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A local SMTP server that prints what it receives")
    parser.add_argument("--port", type=int, default=0)
    server = SMTPServer(parser.parse_args().port).start()
    print(f"SMTP listening on {server.host}:{server.port}", flush=True)
    seen = 0
    try:
        while True:
            time.sleep(0.5)
            for message in server.messages[seen:]:
                print(f"{message['Message-ID']} to {message['To']}: {message['Subject']}", flush=True)
            seen = len(server.messages)
    except KeyboardInterrupt:
        server.stop()
