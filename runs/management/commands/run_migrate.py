"""manage.py run_migrate <schema> <run id> <version>: re-pin a waiting or failed run to a newer
version of its agent (runs.services.run_migrate)."""

import getpass
from uuid import UUID

from django.core.management.base import BaseCommand, CommandError
from django_tenants.utils import schema_context

from runs.services import RunError, run_migrate
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Re-pin a waiting or failed run to a newer version of its agent."

    def add_arguments(self, parser):
        parser.add_argument("schema_name", help="the run's tenant")
        parser.add_argument("run_id", type=UUID)
        parser.add_argument("version", type=int)

    def handle(self, schema_name, run_id, version, **options):
        if not Tenant.objects.filter(schema_name=schema_name).exists():
            raise CommandError(f"no tenant {schema_name}")
        with schema_context(schema_name):
            try:
                run = run_migrate(run_id=run_id, version=version,
                                  by=f"command:{getpass.getuser()}")
            except RunError as exc:
                raise CommandError(f"{exc.code}: {exc.message}") from None
        self.stdout.write(f"run {run.id}: {run.agent} v{run.agent_version}, {run.status}")
