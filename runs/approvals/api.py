"""REST API for the approvals inbox and for events (`/api/v1/`), tenant by API key."""

import json

from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from agentplatform.api_contract import (
    NewestFirst,
    StrictStrings,
    error,
    filters_valid,
)
from tenants.models import Scope

from . import services
from .models import Approval
from .selectors import approval_list, approval_or_404


class ApprovalSerializer(serializers.ModelSerializer):
    class Meta:
        model = Approval
        fields = ["id", "run", "visit", "kind", "request", "deciders", "status", "then",
                  "on_timeout", "expires_at", "decided_by", "comment", "artifact", "decided_at",
                  "created_at"]


RESULT_MAX_BYTES = 64 * 1024  # a connector's answer (ids, timestamps), not a document


class DecisionSerializer(StrictStrings, serializers.Serializer):
    decision = serializers.ChoiceField(["approve", "reject"])
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=10000)
    artifact = serializers.JSONField(required=False)  # approve with an edited artifact
    # "outcome unknown" approved as delivered: the result the step reads (else a confirmation)
    result = serializers.DictField(required=False)

    def validate_result(self, value):
        if len(json.dumps(value, default=str)) > RESULT_MAX_BYTES:
            raise serializers.ValidationError(f"at most {RESULT_MAX_BYTES} bytes of JSON")
        return value


class InboundEventSerializer(StrictStrings, serializers.Serializer):
    kind = serializers.RegexField(r"^[a-z0-9_.:-]{1,64}$")
    key = serializers.CharField(max_length=255)
    payload = serializers.DictField(required=False, default=dict)
    id = serializers.CharField(required=False, max_length=255)  # dedupe: same id, same event


class EventAcceptedSerializer(serializers.Serializer):
    event = serializers.IntegerField()
    duplicate = serializers.BooleanField(help_text="This `id` was delivered before: nothing new.")
    resumed = serializers.ListField(child=serializers.UUIDField(), help_text="Runs it woke.")


class ApprovalFilterSerializer(serializers.Serializer):
    status = serializers.ChoiceField(Approval.Status.values, required=False)
    run = serializers.UUIDField(required=False)


class ApprovalList(generics.ListAPIView):
    required_scopes = {"GET": Scope.RUNS_READ}
    serializer_class = ApprovalSerializer
    pagination_class = NewestFirst

    filter_serializer_class = ApprovalFilterSerializer

    @extend_schema(parameters=[ApprovalFilterSerializer])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        filters = filters_valid(self.filter_serializer_class, self.request)
        return approval_list(status=filters.get("status"), run_id=filters.get("run"))


class ApprovalDetail(APIView):
    required_scopes = {"GET": Scope.RUNS_READ}

    @extend_schema(responses={200: ApprovalSerializer})
    def get(self, request, approval_id):
        return Response(ApprovalSerializer(approval_or_404(approval_id)).data)


class ApprovalDecide(APIView):
    required_scopes = {"POST": Scope.APPROVALS_DECIDE}

    @extend_schema(request=DecisionSerializer, responses={
        200: ApprovalSerializer,
        403: error("`not_a_decider`: the caller is not among the approval's deciders; "
                   "`insufficient_scope`; `tenant_suspended`."),
        409: error("`approval_closed`, `approval_expired`, `run_not_waiting`.")})
    def post(self, request, approval_id):
        approval_or_404(approval_id)
        body = DecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        by = f"api:{request.user.api_key.name}"  # who decides is who authenticated
        approval = services.approval_decide(
            approval_id=approval_id, approve=data["decision"] == "approve", by=by,
            comment=data["comment"], artifact=data.get("artifact"), result=data.get("result"))
        return Response(ApprovalSerializer(approval).data)


class EventCreate(APIView):
    """Deliver an event to whatever waits on (kind, key). Unmatched events are kept: a run
    that parks on them later is woken at once."""

    required_scopes = {"POST": Scope.EVENTS_WRITE}

    @extend_schema(request=InboundEventSerializer,
                   responses={202: EventAcceptedSerializer, 200: EventAcceptedSerializer})
    def post(self, request):
        body = InboundEventSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        delivery = services.event_submit(kind=data["kind"], key=data["key"],
                                         payload=data["payload"], source_id=data.get("id"))
        return Response({"event": delivery.event.id, "duplicate": delivery.duplicate,
                         "resumed": [str(r) for r in delivery.resumed]},
                        status=status.HTTP_200_OK if delivery.duplicate else status.HTTP_202_ACCEPTED)
