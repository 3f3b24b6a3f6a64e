import os

from django.core.asgi import get_asgi_application

from agentplatform.metrics import fleet_observe

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")
# A web process observes the fleet gauges (ready list, outbox backlog); workers do not.
fleet_observe()
application = get_asgi_application()
