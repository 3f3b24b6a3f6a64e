import os

from django.core.wsgi import get_wsgi_application

from agentplatform.metrics import fleet_observe
from agentplatform.telemetry import incoming_trace_dropped_wsgi

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")
# A web process observes the fleet gauges (ready list, outbox backlog); workers do not.
fleet_observe()
# a caller's own trace headers are not trusted (agentplatform.telemetry)
application = incoming_trace_dropped_wsgi(get_wsgi_application())
