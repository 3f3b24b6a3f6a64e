"""What each role of a tenant's member may do. The dashboard checks one of these permissions on
the server for every page and action; the API's equivalent is a key's scopes (tenants.Scope).

Roles are not a ladder: an approver decides but does not start or cancel runs, an operator
starts and cancels but does not decide (a run's author is not its approver). Owners and admins
may do both."""

from .models import Role

READ = "read"  # every page of the tenant
RUNS_WRITE = "runs:write"  # start, cancel, fork, re-queue, migrate runs; deliver events
APPROVALS_DECIDE = "approvals:decide"
INTEGRATIONS_MANAGE = "integrations:manage"  # connections, connector credentials, egress
SETTINGS_MANAGE = "settings:manage"  # members, invitations, API keys, retention, two-factor
AGENTS_DEFINE = "agents:define"  # create, edit and retire the tenant's own agent definitions

PERMISSIONS: dict[str, frozenset[str]] = {
    Role.OWNER: frozenset({READ, RUNS_WRITE, APPROVALS_DECIDE, INTEGRATIONS_MANAGE,
                           SETTINGS_MANAGE, AGENTS_DEFINE}),
    Role.ADMIN: frozenset({READ, RUNS_WRITE, APPROVALS_DECIDE, INTEGRATIONS_MANAGE, AGENTS_DEFINE}),
    Role.OPERATOR: frozenset({READ, RUNS_WRITE}),
    Role.APPROVER: frozenset({READ, APPROVALS_DECIDE}),
    Role.VIEWER: frozenset({READ}),
}


def role_may(role: str, permission: str) -> bool:
    return permission in PERMISSIONS.get(role, frozenset())
