"""Sandbox reads: the tenant's egress allow-list."""

from .egress import EgressRule, egress_rule_parse
from .models import SandboxEgressRule


def egress_rules() -> list[EgressRule]:
    """The current tenant's allow-list, in the order it was allowed; empty means no egress."""
    return [egress_rule_parse(rule)
            for rule in SandboxEgressRule.objects.order_by("id").values_list("rule", flat=True)]
