"""The customers' web dashboard: server-rendered pages (Django templates and htmx) where a
tenant's people sign in and see and act on their runs, approvals, agents and settings.

It owns no business logic: every read and write goes through the same selectors and services
as the REST API. `access.tenant_page` is the one door into a tenant: it finds the person's
membership (404 when there is none), asks for the second factor where the tenant requires it,
checks the role's permission (403) and runs the view inside the tenant's schema."""
