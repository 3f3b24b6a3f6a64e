"""Print an archived run's history (fetched, verified, decrypted) as JSON."""

import json
import os
from uuid import UUID

from django.core.management.base import BaseCommand, CommandError
from django_tenants.utils import tenant_context

from runs.retention import services
from runs.retention.envelope import ArchiveError
from runs.retention.selectors import json_default
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Restore an archived run for audit: restore_archive <schema> <run id> [--output FILE]"

    def add_arguments(self, parser):
        parser.add_argument("schema")
        parser.add_argument("run_id", type=UUID)
        parser.add_argument("--output", help="write the JSON here instead of standard output")

    def handle(self, *args, schema, run_id, output=None, **options):
        tenant = Tenant.objects.filter(schema_name=schema).first()
        if tenant is None:
            raise CommandError(f"no tenant {schema!r}")
        with tenant_context(tenant):
            try:
                history = services.archive_restore(tenant=tenant, run_id=run_id)
            except ArchiveError as exc:
                raise CommandError(f"{exc.code}: {exc}") from None
        text = json.dumps(history, default=json_default, indent=2)
        if output:
            # A run's history is tenant data: readable by the operator's account only, even when
            # the file existed before with a wider mode.
            fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w") as file:
                file.write(text + "\n")
            self.stderr.write(f"wrote {output}")
        else:
            self.stdout.write(text)
