"""Lost or doubled work in the runner, in this process: call ids that would name two calls'
effects alike, values PostgreSQL cannot store (a NUL in a model's reply or a receiver's answer)
that would have a recorded turn paid again on every retry, and a call whose outcome is unknown
after its retries, which the model must not read as "not made"."""

import json

from runs.definitions.runner import _calls_read


def raw(id: str, **arguments) -> dict:
    return {"id": id, "type": "function",
            "function": {"name": "post", "arguments": json.dumps(arguments)}}


def test_a_fallback_call_id_never_takes_an_id_the_model_gave_another_call_of_the_reply():
    # the second call has no id; its fallback ("call_1_1") is the first call's own id
    calls = _calls_read([raw("call_1_1", n=1), raw("", n=2), raw("call_1_1", n=3)], turn=1)
    ids = [call["id"] for call in calls]
    assert len(set(ids)) == 3, ids  # three calls, three effects ("tool:<id>")
    assert ids[0] == "call_1_1"
    # and the same reply read again (a step re-run) names them alike: effects stay stable
    assert [c["id"] for c in _calls_read([raw("call_1_1", n=1), raw("", n=2),
                                          raw("call_1_1", n=3)], turn=1)] == ids
