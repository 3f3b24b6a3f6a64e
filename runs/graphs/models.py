"""LangGraph's checkpoint tables, in each tenant's schema (written by `runs.graphs.saver` only,
in raw SQL: these models are the schema and its constraints, not an API).

A checkpoint row holds the checkpoint without its stored channel values; the values live in
blobs, one per (channel, version), written once. A list value that extends its parent
checkpoint's list is stored as the appended suffix on top of that version (`base_version`), so
a thread that appends a message per step stores each message once.
"""

from django.db import models
from django.db.models.functions import Now


class GraphCheckpoint(models.Model):
    """One checkpoint of a thread's namespace: ids, the checkpoint itself (without the channel
    values kept in blobs), the versions that name those blobs, and the metadata to filter on."""

    pk = models.CompositePrimaryKey("thread_id", "checkpoint_ns", "checkpoint_id")
    thread_id = models.TextField()
    checkpoint_ns = models.TextField(blank=True)
    checkpoint_id = models.TextField()
    parent_checkpoint_id = models.TextField(null=True)
    type = models.TextField()  # the serializer's tag for `checkpoint`
    checkpoint = models.BinaryField()
    channel_versions = models.JSONField(default=dict)
    metadata = models.JSONField(default=dict)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "graphs_checkpoint"
        # a thread's latest checkpoint is the one written last (saver.py: by the database clock)
        indexes = [models.Index(fields=["thread_id", "checkpoint_ns", "-created_at"],
                                name="graph_checkpoint_written")]
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(parent_checkpoint_id=models.F("checkpoint_id")),
                name="graph_checkpoint_not_its_own_parent"),
        ]


class GraphBlob(models.Model):
    """A channel's value at one version: whole (`base_version` NULL), or the list appended to
    the list stored at `base_version` of the same channel."""

    pk = models.CompositePrimaryKey("thread_id", "checkpoint_ns", "channel", "version")
    thread_id = models.TextField()
    checkpoint_ns = models.TextField(blank=True)
    channel = models.TextField()
    version = models.TextField()
    type = models.TextField()
    blob = models.BinaryField()
    base_version = models.TextField(null=True)

    class Meta:
        db_table = "graphs_blob"
        constraints = [
            models.CheckConstraint(condition=~models.Q(base_version=models.F("version")),
                                   name="graph_blob_not_its_own_base"),
        ]


class GraphWrite(models.Model):
    """A pending write of a task to a channel, linked to the checkpoint it follows."""

    pk = models.CompositePrimaryKey("thread_id", "checkpoint_ns", "checkpoint_id", "task_id",
                                    "idx")
    thread_id = models.TextField()
    checkpoint_ns = models.TextField(blank=True)
    checkpoint_id = models.TextField()
    task_id = models.TextField()
    task_path = models.TextField(blank=True)
    idx = models.IntegerField()  # position in the task's writes; special writes are negative
    channel = models.TextField()
    type = models.TextField()
    blob = models.BinaryField()

    class Meta:
        db_table = "graphs_write"
