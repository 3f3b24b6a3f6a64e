import os

from django.core.asgi import get_asgi_application

from agentplatform.metrics import fleet_observe
from agentplatform.telemetry import incoming_trace_dropped_asgi

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")
# A web process observes the fleet gauges (ready list, outbox backlog); workers do not.
fleet_observe()
# a caller's own trace headers are not trusted (agentplatform.telemetry)
application = incoming_trace_dropped_asgi(get_asgi_application())
