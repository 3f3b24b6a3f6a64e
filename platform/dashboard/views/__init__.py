"""Dashboard views, one module per area; each module's `urlpatterns` is mounted by
dashboard.urls (accounts at the root, the rest under /t/<tenant>/)."""
