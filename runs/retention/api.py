"""REST: `GET /api/v1/runs/<id>/archive` restores an archived run's history, read-only. An
ArchiveError answers by its code (agentplatform.api_errors): not_found 404 (another tenant's
archive does not exist here either), the store out of reach 503, an archive that does not open
500."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from agentplatform.api_contract import error
from tenants.models import Scope

from . import services


class RunArchive(APIView):
    required_scopes = {"GET": Scope.RUNS_READ}

    @extend_schema(responses={
        200: OpenApiTypes.OBJECT,  # the run, its events, checkpoints and effects as archived
        503: error("`archive_store_unavailable`: the archive store is out of reach; retry.")})
    def get(self, request, run_id):
        return Response(services.archive_restore(tenant=request.tenant, run_id=run_id))
