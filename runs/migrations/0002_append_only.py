"""Append-only guard: UPDATE/DELETE on events, checkpoints and log entries is refused unless
the transaction says `SET LOCAL agentplatform.allow_prune = 'on'` (the retention job's path)."""

from django.db import migrations

TABLES = ["runs_runevent", "runs_checkpoint", "runs_logentry"]

FUNCTION = """
CREATE FUNCTION runs_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('agentplatform.allow_prune', true), '') = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;
"""

forward = [FUNCTION] + [
    f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
    f"FOR EACH ROW EXECUTE FUNCTION runs_refuse_change();"
    for table in TABLES
]
backward = [f"DROP TRIGGER {table}_append_only ON {table};" for table in TABLES] + [
    "DROP FUNCTION runs_refuse_change();"
]


class Migration(migrations.Migration):
    dependencies = [("runs", "0001_initial")]
    operations = [migrations.RunSQL(forward, backward)]
