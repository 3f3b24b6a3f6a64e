"""The runs list: newest first, from runs.selectors like the API's list."""

from django.shortcuts import render
from django.urls import path

from runs.selectors import run_list

from ..access import tenant_page

PAGE = 50


@tenant_page()
def runs(request, tenant):
    return render(request, "dashboard/runs/list.html", {
        "section": "runs", "runs": run_list().order_by("-created_at")[:PAGE]})


urlpatterns = [
    path("runs", runs, name="runs"),
]
