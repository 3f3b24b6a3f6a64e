"""`manage.py add_member demo ada@example.com --role owner [--password-env VAR]`: give a person
a role in a tenant (their account is made if missing). Without a password the account cannot
sign in until its owner resets the password by email; with one, an existing account's password
is set to it."""

import os

from django.core.management.base import BaseCommand, CommandError

from tenants.models import Role, Tenant
from tenants.people import PeopleError, member_add


class Command(BaseCommand):
    help = "Give a person (by email) a role in a tenant; the account is created if missing."

    def add_arguments(self, parser):
        parser.add_argument("tenant")
        parser.add_argument("email")
        parser.add_argument("--role", default=Role.OWNER, choices=Role.values)
        parser.add_argument("--password-env", default="",
                            help="name of an environment variable holding a new account's "
                                 "password (never a password on the command line)")

    def handle(self, tenant, email, role, password_env, **options):
        row = Tenant.objects.filter(schema_name=tenant).first()
        if row is None:
            raise CommandError(f"no tenant {tenant!r}")
        password = os.environ.get(password_env) if password_env else None
        if password_env and not password:
            raise CommandError(f"${password_env} is empty")
        try:
            membership = member_add(tenant=row, email=email, role=role, by="operator:add_member",
                                    password=password)
        except PeopleError as exc:
            raise CommandError(exc.message) from None
        user = membership.user
        if password and not user.check_password(password):  # an existing account: reset it
            user.set_password(password)
            user.save(update_fields=["password"])
        self.stdout.write(f"{membership.user.username} is {membership.role} in {tenant}")
