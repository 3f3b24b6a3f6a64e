"""The chaos and recovery benchmarks count what happened outside the database: each count is
checked here on deliveries and step executions made up to break it. (Chaos end to end takes
over a minute even small: worker, web server and schema set-up; run `python -m bench chaos`.)"""

import uuid
from collections import Counter

from bench.chaos import chaos_count, expected_messages
from bench.recovery import duplicates_committed


def delivered(inputs: dict) -> tuple[dict, Counter, Counter]:
    """Every expected message once, under one key each: what a perfect platform delivers."""
    hooks, slack, notes = {}, Counter(), Counter()
    for run_id, run_input in inputs.items():
        expected = expected_messages(run_id, run_input)
        hooks.update({m: {f"key:{m}"} for m in expected["webhook"]})
        slack.update(expected["slack"])
        notes.update(expected["notes"])
    return hooks, slack, notes


def two_runs() -> tuple[dict, dict]:
    plain, waiting = uuid.uuid4(), uuid.uuid4()
    inputs = {plain: {"steps": 3, "seconds": 0}, waiting: {"steps": 2, "seconds": 0,
                                                           "channel": "CW1"}}
    return inputs, {plain: "succeeded", waiting: "succeeded"}


def test_a_perfect_delivery_counts_zero_everywhere():
    inputs, statuses = two_runs()
    hooks, slack, notes = delivered(inputs)
    counts, lost = chaos_count(inputs=inputs, statuses=statuses, hooks_seen=hooks,
                               slack_seen=slack, notes_seen=notes, accepted={"CW1"})
    assert counts == {"lost_effects": 0, "duplicate_effects": 0, "outbox_double_sends": 0,
                      "lost_wakeups": 0, "stuck_runs": 0}


def test_a_repeat_under_the_same_key_is_no_duplicate_at_the_deduplicating_receiver_only():
    inputs, statuses = two_runs()
    hooks, slack, notes = delivered(inputs)
    plain = next(iter(inputs))
    hooks[f"{plain}/work2/hook"].add("another key")  # the webhook acted twice
    slack[f"{plain}/work3/post"] += 1  # Slack shows the message twice, whatever the key
    notes[f"{plain}/work1/note"] += 2  # the notification went out three times
    counts, _ = chaos_count(inputs=inputs, statuses=statuses, hooks_seen=hooks,
                            slack_seen=slack, notes_seen=notes, accepted={"CW1"})
    assert counts["duplicate_effects"] == 2
    assert counts["outbox_double_sends"] == 2
    assert counts["lost_effects"] == counts["lost_wakeups"] == counts["stuck_runs"] == 0


def test_missing_messages_of_succeeded_runs_are_lost_and_runs_that_did_not_succeed_are_stuck():
    inputs, statuses = two_runs()
    plain, waiting = inputs
    hooks, slack, notes = delivered(inputs)
    del hooks[f"{plain}/work1/hook"], notes[f"{plain}/work1/note"]
    del hooks[f"{waiting}/woken/hook"]  # its event was answered 200, and it never resumed
    statuses[waiting] = "waiting"
    counts, lost = chaos_count(inputs=inputs, statuses=statuses, hooks_seen=hooks,
                               slack_seen=slack, notes_seen=notes, accepted={"CW1"})
    assert lost == Counter(webhook=1, notes=1)  # the waiting run's messages are not expected
    assert counts["lost_effects"] == 2
    assert counts["lost_wakeups"] == 1
    assert counts["stuck_runs"] == 1


def test_recovery_counts_a_step_committed_twice_not_a_step_cut_short_by_a_kill(tmp_path):
    log = tmp_path / "executions.log"
    # Step 2 ran on pid 10, which was killed; pid 20 ran it again and step 3 continued that.
    log.write_text("r 1 - a 10\nr 2 a b 10\nr 2 a c 20\nr 3 c d 20\nr 4 d - 20\n")
    assert duplicates_committed(log) == 0
    # Both executions of step 2 were kept: step 3 ran on top of each.
    log.write_text("r 1 - a 10\nr 2 a b 10\nr 2 a c 20\nr 3 b d 10\nr 3 c e 20\n"
                   "r 4 e - 20\n")
    assert duplicates_committed(log) == 1
