"""gunicorn's settings for the web process (agentplatform-web.service, the Containerfile).

WSGI, threaded workers: every view is synchronous Django, so ASGI would only add a thread hop
per request. Requests are short (runs are driven by Celery workers, never by a request), and a
thread per request keeps a slow client from holding a whole process.
"""

import os

wsgi_app = "agentplatform.wsgi:application"
bind = os.environ.get("WEB_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))  # about one per core
worker_class = "gthread"
threads = int(os.environ.get("WEB_THREADS", "8"))
timeout = 60  # a worker silent this long is restarted
graceful_timeout = 30  # SIGTERM: requests in progress get this long to finish
max_requests, max_requests_jitter = 5000, 500  # bounds the growth of a long-lived process
accesslog = "-"
errorlog = "-"
