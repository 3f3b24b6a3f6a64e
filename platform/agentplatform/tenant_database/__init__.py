"""The database backend (ENGINE `agentplatform.tenant_database`): django-tenants' PostgreSQL
backend, with the tenant's schema selected inside each statement's own transaction."""
