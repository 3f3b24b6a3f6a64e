"""REST: `GET /api/v1/usage?from=&to=&group=day|month`: the calling tenant's use per UTC day
or calendar month (from its UsageDay rows: as of the last metering pass), and its quotas now."""

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from agentplatform.api_contract import filters_valid
from agentplatform.api_errors import ApiError
from tenants.models import Scope

from .selectors import MAX_DAYS, usage_days, usage_months, usage_summary


class UsageFilterSerializer(serializers.Serializer):
    # "from" is a Python keyword: the field is declared below under its query name
    to = serializers.DateField(required=False, input_formats=["iso-8601"],
                               help_text="Last UTC day, YYYY-MM-DD (default: today).")
    group = serializers.ChoiceField(["day", "month"], required=False, default="day",
                                    help_text="One row per day (default) or per calendar month.")

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = serializers.DateField(
            required=False, input_formats=["iso-8601"],
            help_text="First UTC day, YYYY-MM-DD (default: the first of this month).")
        return fields


class ModelUseSerializer(serializers.Serializer):
    tokens_in = serializers.IntegerField()
    tokens_out = serializers.IntegerField()
    cost_usd = serializers.CharField(help_text="Decimal, as a string.")


class UsagePeriodSerializer(serializers.Serializer):
    period = serializers.CharField(help_text="YYYY-MM-DD (group=day) or YYYY-MM (group=month).")
    start = serializers.DateField()
    runs_started = serializers.IntegerField()
    runs_finished = serializers.DictField(child=serializers.IntegerField(),
                                          help_text="Runs that ended, by status.")
    steps = serializers.IntegerField(help_text="Steps of the runs that finished in the period.")
    active_seconds = serializers.FloatField()
    tokens_in = serializers.IntegerField()
    tokens_out = serializers.IntegerField()
    cost_usd = serializers.DecimalField(max_digits=20, decimal_places=6, coerce_to_string=True)
    models = serializers.DictField(child=ModelUseSerializer(), help_text="Tokens and cost by model.")
    effects = serializers.DictField(child=serializers.IntegerField(),
                                    help_text="Effects done, by connector.")
    sandbox_cpu_seconds = serializers.FloatField()
    sandbox_wall_seconds = serializers.FloatField()
    hot_bytes = serializers.IntegerField(help_text="The tenant's schema size (a month: its last day's).")
    archive_bytes = serializers.IntegerField(help_text="Archived objects (a month: its last day's).")
    api_requests = serializers.IntegerField()


class QuotaUseSerializer(serializers.Serializer):
    quota = serializers.CharField()
    limit = serializers.FloatField(allow_null=True, help_text="null: no limit.")
    used = serializers.FloatField()
    resets_at = serializers.DateTimeField(allow_null=True, help_text="null: the count does not reset.")


class UsageSerializer(serializers.Serializer):
    group = serializers.ChoiceField(["day", "month"])
    periods = UsagePeriodSerializer(many=True)
    quotas = QuotaUseSerializer(many=True, help_text="Each quota now, as run starts check them.")

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = serializers.DateField()
        fields["to"] = serializers.DateField()
        return fields


class Usage(APIView):
    required_scopes = {"GET": Scope.RUNS_READ}

    @extend_schema(parameters=[UsageFilterSerializer], responses={200: UsageSerializer})
    def get(self, request):
        filters = filters_valid(UsageFilterSerializer, request)
        today = timezone.now().date()
        until = filters.get("to") or today
        since = filters.get("from") or until.replace(day=1)
        if since > until:
            raise ApiError("invalid_filter", "from is after to",
                           fields={"from": [f"{since} is after to ({until})."]})
        if until - since >= timedelta(days=MAX_DAYS):
            raise ApiError("invalid_filter", f"the range is longer than {MAX_DAYS} days",
                           fields={"to": [f"At most {MAX_DAYS} days from `from`."]})
        group = filters.get("group", "day")
        pick = usage_months if group == "month" else usage_days
        periods = [period.as_dict() for period in pick(tenant=request.tenant, since=since,
                                                       until=until)]
        quotas = [{**use.as_dict(), "resets_at": use.resets_at}
                  for use in usage_summary(tenant=request.tenant)]
        return Response(UsageSerializer({"group": group, "periods": periods, "quotas": quotas,
                                         "from": since, "to": until}).data)
