"""REST: `GET /api/v1/runs/<id>/archive` restores an archived run's history, read-only."""

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from agentplatform.api_errors import ApiError

from . import services
from .envelope import ArchiveError
from .store import ArchiveStoreUnavailable


class RunArchive(APIView):
    def get(self, request, run_id):
        try:
            return Response(services.archive_restore(tenant=request.tenant, run_id=run_id))
        except services.ArchiveNotFound:  # another tenant's archive does not exist here either
            raise ApiError("not_found", "This run has no archive.", status.HTTP_404_NOT_FOUND) from None
        except ArchiveStoreUnavailable as exc:
            raise ApiError(exc.code, str(exc), status.HTTP_503_SERVICE_UNAVAILABLE) from None
        except ArchiveError as exc:  # corrupt, or not openable with this tenant's keys
            raise ApiError(exc.code, str(exc), status.HTTP_500_INTERNAL_SERVER_ERROR) from None
