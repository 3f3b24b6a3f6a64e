from django.core.management.base import BaseCommand, CommandError

from tenants.keys import KeyUnwrapError, MasterKeyMissing
from tenants.services import data_keys_rewrap


class Command(BaseCommand):
    help = ("Re-wrap every data key still in the first (unbound) wrap format bound to its tenant "
            "and version. Run once every process runs the code that reads both formats; "
            "idempotent. --to-legacy reverses it, only before rolling code back past the binding.")

    def add_arguments(self, parser):
        parser.add_argument("--to-legacy", action="store_true",
                            help="wrap every key in the first format again (rollback only)")

    def handle(self, *args, to_legacy=False, **options):
        try:
            changed = data_keys_rewrap(to_legacy=to_legacy)
        except (KeyUnwrapError, MasterKeyMissing) as exc:
            raise CommandError(str(exc)) from None
        form = "the first (unbound) format" if to_legacy else "the tenant-bound format"
        self.stdout.write(f"{changed} data key(s) re-wrapped in {form}")
