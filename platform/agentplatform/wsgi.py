import os

from django.core.wsgi import get_wsgi_application

from agentplatform.metrics import fleet_observe

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")
# A web process observes the fleet gauges (ready list, outbox backlog); workers do not.
fleet_observe()
application = get_wsgi_application()
