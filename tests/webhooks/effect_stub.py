"""Stand-in for `ctx.effect` while this branch predates the effect ledger (built in main): it
records each call as a run event, so the onboarding path can be driven by real workers.
Does nothing once StepContext has a real `effect`. Loaded by workers via AGENT_MODULES."""

from runs.engine import StepContext, event_record

if not hasattr(StepContext, "effect"):
    def _effect_stub(self, name, connector, **args):
        self.barrier()
        event_record(run_id=self.run_id, kind="effect_stubbed", visit=self.visit, name=name,
                     connector=connector, args=args)
        return {"stubbed": True}

    StepContext.effect = _effect_stub
