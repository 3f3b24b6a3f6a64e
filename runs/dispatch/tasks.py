"""Celery beat's tick: the watchdog, due timers, then fair dispatch (public schema)."""

from celery import shared_task

from . import services


@shared_task(name="dispatch.tick", ignore_result=True)
def tick() -> None:
    services.watchdog()
    services.wakeups_fire()
    services.dispatch_ready()
