"""The composition root: wires the apps that plug into the engine into the ports of the layers
below them (runs/engine/ports.py, runs/parked.py, runs/dispatch/ports.py) and the approvals
inbox's announcers, once, at start-up. Last in INSTALLED_APPS, so every app is loaded;
web processes, Celery workers (their Django fixup calls django.setup()) and management
commands all run ready().
"""

from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class PlatformConfig(AppConfig):
    name = "agentplatform"
    label = "agentplatform"
    verbose_name = "Agent platform (composition root)"

    def ready(self) -> None:
        # Imported here: an app's services may load only once every app's models are ready.
        from agentplatform.metrics import fleet_wire
        from integrations.webhooks.slack_approvals import slack_approval_announce
        from runs.agents import TenantAgents, graph_agents, registry, tenant_agents
        from runs.approvals.services import (
            ANNOUNCERS,
            approval_open,
            event_deliver,
            gate_open,
            parked_cancel,
            wakeup_cancel,
            wakeup_fire,
            wakeup_schedule,
        )
        from runs.definitions.registry import tenant_agent_get, tenant_agents_all
        from runs.dispatch.ports import TickHandlers, tick_handlers_wire
        from runs.dispatch.selectors import ready_backlog
        from runs.effects.selectors import outbox_backlog
        from runs.effects.services import (
            budget_checker,
            effect_outcome_unknown,
            effect_perform,
            outbox_kick,
        )
        from runs.engine.ports import Ports, ports_wire
        from runs.graphs.driver import graph_agent_define
        from runs.parked import Inbox, inbox_wire
        from runs.services import child_report, run_start, runs_inspect_in_flight
        from runs.usage.models import Plan, TenantQuota
        from runs.usage.quotas import api_rate_per_minute, quota_limits_changed
        from sandboxes.services import SandboxSession
        from tenants.throttling import TenantPlanRateThrottle

        ports_wire(Ports(
            effect_perform=effect_perform,
            effect_outcome_unknown=effect_outcome_unknown,
            budget_checker=budget_checker,
            outbox_kick=outbox_kick,
            sandbox_session=SandboxSession,
            parking={
                "approval": approval_open,
                "event_gate": gate_open,
                "timer": wakeup_schedule,
                "child_run": run_start,
                "child_report": child_report,
            },
        ))
        inbox_wire(Inbox(
            approval_open=approval_open, gate_open=gate_open, wakeup_schedule=wakeup_schedule,
            wakeup_cancel=wakeup_cancel, event_deliver=event_deliver, parked_cancel=parked_cancel,
        ))
        tenant_agents.wire(TenantAgents(get=tenant_agent_get, all=tenant_agents_all))
        graph_agents.wire(graph_agent_define)
        tick_handlers_wire(TickHandlers(runs_inspect_in_flight=runs_inspect_in_flight,
                                        wakeup_fire=wakeup_fire))
        TenantPlanRateThrottle.rate_of = lambda tenant: api_rate_per_minute(tenant=tenant)
        for model in (Plan, TenantQuota):  # the throttle's cached limits are read again
            for signal in (post_save, post_delete):
                signal.connect(quota_limits_changed, sender=model,
                               dispatch_uid=f"quota_limits_changed:{model.__name__}")
        fleet_wire(ready=ready_backlog, outbox=outbox_backlog)
        if slack_approval_announce not in ANNOUNCERS:  # ready() may run twice in one process
            ANNOUNCERS.append(slack_approval_announce)
        # Agent modules register agents (and may register connectors): every process that runs
        # steps or delivers effects needs them. Loaded last: a LangGraph agent needs its port.
        registry.load()
