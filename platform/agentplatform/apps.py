"""The composition root: wires the apps that plug into the engine into its ports
(runs/engine/ports.py), once, at start-up. Last in INSTALLED_APPS, so every app is loaded;
web processes, Celery workers (their Django fixup calls django.setup()) and management
commands all run ready().
"""

from django.apps import AppConfig


class PlatformConfig(AppConfig):
    name = "agentplatform"
    label = "agentplatform"
    verbose_name = "Agent platform (composition root)"

    def ready(self) -> None:
        # Imported here: an app's services may load only once every app's models are ready.
        from runs.approvals.services import approval_open, gate_open, wakeup_schedule
        from runs.effects.services import budget_checker, effect_perform, outbox_kick
        from runs.engine.ports import Ports, ports_wire
        from runs.services import child_report, run_start
        from sandboxes.services import SandboxSession

        ports_wire(Ports(
            effect_perform=effect_perform,
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
