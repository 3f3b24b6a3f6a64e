"""REST API for connector credentials (`/api/v1/credentials`). Secrets go in, never come out."""

from django.core.validators import MinLengthValidator
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from agentplatform.api_contract import error
from agentplatform.api_errors import ApiError
from tenants.models import Scope

from . import services
from .connectors import connector_get
from .connectors.base import BUILTIN
from .models import Credential
from .selectors import credential_find, credential_list, credential_or_404


class CredentialSerializer(serializers.ModelSerializer):
    class Meta:
        model = Credential
        fields = ["connector", "label", "key_version", "created_at", "updated_at"]


class CredentialSetSerializer(serializers.Serializer):
    secrets = serializers.DictField(
        validators=[MinLengthValidator(1)],
        help_text=f"The connector's secrets (at most {services.SECRETS_MAX_BYTES} bytes of JSON); "
                  "written, never read back.")


class CredentialPageSerializer(serializers.Serializer):
    results = CredentialSerializer(many=True)


def _connector_known(name: str) -> bool:
    try:
        connector_get(name)
    except LookupError:
        return False
    return True


# The path names a connector the platform has and a label in the service's own format.
CREDENTIAL_PATH = [
    OpenApiParameter("connector", OpenApiTypes.STR, OpenApiParameter.PATH, enum=list(BUILTIN)),
    OpenApiParameter("label", OpenApiTypes.STR, OpenApiParameter.PATH,
                     pattern=services.LABEL.pattern),
]


class CredentialList(APIView):
    """A tenant holds a handful of credentials: one page, ordered by connector and label."""

    required_scopes = {"GET": Scope.ADMIN}

    @extend_schema(operation_id="credentials_list", responses={200: CredentialPageSerializer})
    def get(self, request):
        return Response({"results": CredentialSerializer(credential_list(), many=True).data})


@extend_schema_view(get=extend_schema(parameters=CREDENTIAL_PATH),
                    put=extend_schema(parameters=CREDENTIAL_PATH),
                    delete=extend_schema(parameters=CREDENTIAL_PATH))
class CredentialDetail(APIView):
    """A path no credential can have (a label outside its pattern, a connector name that is no
    name, or for GET and DELETE no connector of the platform's) is 404 before any query: a NUL
    in the path must not reach PostgreSQL. A PUT under a label outside its pattern is 400
    `invalid_label`: the request, not the credential, is wrong."""

    required_scopes = {"GET": Scope.ADMIN, "PUT": Scope.ADMIN, "DELETE": Scope.ADMIN}

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)  # the key and its scopes first
        connector, label = kwargs["connector"], kwargs["label"]
        if request.method == "PUT":
            # writing under a label no credential may have is a bad request, not a missing one
            services.credential_label_check(label)
        if not (services.NAME.fullmatch(connector) and services.LABEL.fullmatch(label)):
            raise ApiError("not_found", "No such credential.")
        if request.method != "PUT" and not _connector_known(connector):
            raise ApiError("not_found", "No such credential.")

    @extend_schema(responses={200: CredentialSerializer})
    def get(self, request, connector, label):
        return Response(CredentialSerializer(credential_or_404(connector=connector, label=label)).data)

    @extend_schema(request=CredentialSetSerializer,
                   responses={200: CredentialSerializer, 201: CredentialSerializer,
                              400: error("`invalid_request` (with `fields`), `invalid_secrets`.")})
    def put(self, request, connector, label):
        body = CredentialSetSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if not _connector_known(connector):
            raise ApiError("unknown_connector", f"There is no connector named {connector!r}.")
        existed = credential_find(connector=connector, label=label) is not None
        credential = services.credential_set(
            connector=connector, label=label, secrets=body.validated_data["secrets"])
        return Response(CredentialSerializer(credential).data,
                        status=status.HTTP_200_OK if existed else status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={204: None})
    def delete(self, request, connector, label):
        if not services.credential_delete(connector=connector, label=label):
            raise ApiError("not_found", "No such credential.")
        return Response(status=status.HTTP_204_NO_CONTENT)
