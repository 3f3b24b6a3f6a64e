"""Once re-wrapped every data key in the tenant-bound format; that re-wrap now is
`manage.py data_keys_rewrap`, run after every process runs code that reads both formats, so old
workers still running during a deploy keep reading their keys (decision 0018). Nothing to do
here, in either direction; kept because 0005 depends on it."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("tenants", "0003_tenant_superusers_only_console_access"),
    ]

    operations = []
