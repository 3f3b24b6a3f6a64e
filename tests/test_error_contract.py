"""The one error contract (docs/decisions/0010-one-error-contract.md): every service error is a
ServiceError with a stable code, the API's handler answers all of them, and no view catches one."""

import ast
import importlib
import inspect

import pytest

from agentplatform import api_errors, errors
from integrations.services import CredentialError, CredentialNotFound
from integrations.webhooks.oidc import TokenRejected
from integrations.webhooks.services import WebhookRejected
from runs.approvals.services import ApprovalError
from runs.effects.services import OutboxError
from runs.retention.envelope import ArchiveCorrupt, ArchiveError, ArchiveKeyMismatch
from runs.retention.services import ArchiveNotFound, ArchiveRaced, RetentionError
from runs.retention.store import ArchiveStoreUnavailable
from runs.services import RunError
from tenants.services import ApiKeyRejected, TenantError

# tenants.authentication is not here: DRF wants an APIException from an authenticator, so it
# turns ApiKeyRejected into one (with the same table) itself.
API_MODULES = ["runs.api", "runs.approvals.api", "runs.effects.api", "integrations.api",
               "integrations.webhooks.api", "runs.retention.api"]


def test_errors_module_imports_no_app():
    tree = ast.parse(inspect.getsource(errors))
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


@pytest.mark.parametrize("error", [
    RunError("run_finished", "done"), ApprovalError("approval_closed", "closed"),
    OutboxError("outbox_not_unknown", "delivered"), CredentialError("bad", code="invalid_secrets"),
    CredentialNotFound("gone"), TenantError("no"), ApiKeyRejected("invalid_api_key", "no"),
    WebhookRejected("wrong_team", "no"), TokenRejected("invalid_token", "no"),
    ArchiveError("no"), ArchiveCorrupt("no"), ArchiveKeyMismatch("no"), ArchiveNotFound("no"),
    ArchiveRaced("no"), ArchiveStoreUnavailable("no"), RetentionError("no"),
], ids=lambda error: type(error).__name__)
def test_every_service_error_is_a_service_error_with_a_code_and_message(error):
    assert isinstance(error, errors.ServiceError)
    assert error.code and error.message == str(error)


def test_statuses_come_from_one_table():
    assert api_errors.status_for("not_found") == 404
    assert api_errors.status_for("wrong_team") == 403
    assert api_errors.status_for("archive_store_unavailable") == 503
    assert api_errors.status_for("a_code_nobody_mapped") == 400
    assert api_errors.ApiError("run_finished", "done").status_code == 409


def test_the_handler_answers_a_service_error_in_the_api_shape():
    response = api_errors.exception_handler(WebhookRejected("invalid_signature", "bad"), {})
    assert response.status_code == 401
    assert response.data == {"error": {"code": "invalid_signature", "message": "bad"}}


@pytest.mark.parametrize("name", API_MODULES)
def test_no_view_catches_a_service_error(name):
    module = importlib.import_module(name)
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            caught = eval(compile(ast.Expression(node.type), name, "eval"), vars(module))
            for error in caught if isinstance(caught, tuple) else (caught,):
                assert not issubclass(error, errors.ServiceError), f"{name}:{node.lineno}"
