"""The checkpoints benchmark runs end to end on our side and the floor, without the peers."""

import io
import re

from django.conf import settings

from bench.checkpoints import Floor, Ours, checkpoints_bench
from bench.database import server_dsn


def test_checkpoints_bench_measures_ours_and_the_floor_and_prints_its_closing_line(s3):  # deletes a tenant
    out = io.StringIO()
    summary = checkpoints_bench(
        contenders=[Floor(server_dsn(settings.DATABASES["default"]["NAME"])),
                    Ours(schema="bench_smoke")],
        lengths=(5, 10, 20), repeat=1, warmup=3, out=out,
    )
    lines = out.getvalue().splitlines()
    assert re.fullmatch(
        r"checkpoints: ours=\d+ langgraph=skipped dbos=skipped floor=\d+ "
        r"vs_langgraph=n/a vs_dbos=n/a growth=\d+\.\d\d", lines[-1]), lines[-1]
    assert summary["growth"] is not None and 0 < summary["growth"] < 2
    assert not summary["unavailable"]
    for system in ("ours", "floor"):
        for steps in (5, 10, 20):
            assert re.search(rf"^{system}\s+{steps}\s+\d+\s+\d+\.\d+\s+\d+\s+-?\d+$", out.getvalue(),
                             re.MULTILINE), (system, steps)
