"""Deliver an event to a tenant through the public API, as a customer's system would:
`.venv/bin/python manage.py demo_event docs.signed ada@demo.test [--payload '{"signed": true}']`."""

import json
import os
import shlex
import sys
import urllib.error
import urllib.request
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from tenants.models import Tenant
from tenants.services import ApiKeyRejected, api_key_authenticate, api_key_create


def manage_command() -> str:
    """`manage.py` as a command that works in any shell and directory: this checkout's
    interpreter (its virtualenv's) and manage.py, by absolute path."""
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(settings.BASE_DIR) / 'manage.py'))}"


def demo_key_path(tenant: str) -> Path:
    return Path(settings.BASE_DIR) / ".dev" / f"demo-api-key-{tenant}"


def demo_key(tenant: str, *, verify: bool = False) -> str:
    """The tenant's API key for the demo: AGENTPLATFORM_API_KEY, else the key run_demo minted
    into .dev/ (local development only; the database stores only its hash). `verify`: mint a
    new one if the stored key no longer opens the tenant (the database was made afresh), so
    the commands run_demo prints keep working."""
    if key := os.environ.get("AGENTPLATFORM_API_KEY"):
        return key
    path = demo_key_path(tenant)
    if path.exists():
        key = path.read_text().strip()
        if not verify or _opens(key, tenant):
            return key

    tenant_row = Tenant.objects.filter(schema_name=tenant).first()
    if tenant_row is None:
        raise CommandError(f"no tenant {tenant!r}: run `{manage_command()} create_tenant {tenant}`")
    _, key = api_key_create(tenant=tenant_row, name="demo-cli")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(key + "\n")
    return key


def _opens(key: str, tenant: str) -> bool:
    try:
        return api_key_authenticate(presented=key).tenant.schema_name == tenant
    except ApiKeyRejected:
        return False


class Command(BaseCommand):
    help = "Deliver an event (kind, key) to a tenant through POST /api/v1/events."

    def add_arguments(self, parser):
        parser.add_argument("kind")
        parser.add_argument("key")
        parser.add_argument("--tenant", default="demo")
        parser.add_argument("--payload", default="{}", help="a JSON object")
        parser.add_argument("--id", default=None, help="dedupe id: the same id is delivered once")
        parser.add_argument("--url", default=os.environ.get("AGENTPLATFORM_URL",
                                                            "http://127.0.0.1:8000"))

    def handle(self, kind, key, tenant, payload, id, url, **options):
        try:
            body = {"kind": kind, "key": key, "payload": json.loads(payload)}
        except ValueError as exc:
            raise CommandError(f"--payload is not JSON: {exc}") from None
        if id:
            body["id"] = id
        request = urllib.request.Request(
            f"{url.rstrip('/')}/api/v1/events", data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {demo_key(tenant)}",
                     "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise CommandError(f"{exc.code}: {exc.read().decode(errors='replace')}") from None
        except urllib.error.URLError as exc:
            raise CommandError(f"cannot reach {url} ({exc.reason}); is `make run` up?") from None
        resumed = ", ".join(answer["resumed"]) or "no run (kept for a run that parks on it later)"
        self.stdout.write(f"{kind} {key}: {'duplicate' if answer['duplicate'] else 'delivered'}; "
                          f"resumed {resumed}")
