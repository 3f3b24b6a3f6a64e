"""The Slack connector against a fake Slack Web API: posting with the key in metadata, and
reconciling an interrupted post by finding that key in the channel's history."""

import pytest

from integrations.connectors import ConnectorError, Lookup, connector_get
from integrations.connectors.base import Found
from integrations.connectors.slack import EVENT_TYPE

TOKEN = "xoxb-acme-secret"


@pytest.fixture
def slack():
    return connector_get("slack")


def creds(fake) -> dict:
    return {"token": TOKEN, "api_url": f"{fake.url}/api"}


def test_a_message_is_posted_with_the_key_in_its_metadata(slack, fake_slack, call):
    result = slack.execute(call({"channel": "C0ACME", "text": "deploy done"}, creds(fake_slack),
                                key="run-1:2:notify"))
    assert result["channel"] == "C0ACME" and result["ts"]
    [message] = fake_slack.messages["C0ACME"]
    assert message["text"] == "deploy done"
    assert message["metadata"] == {"event_type": EVENT_TYPE,
                                   "event_payload": {"idempotency_key": "run-1:2:notify"}}
    assert not slack.honours_idempotency_key


def test_lookup_finds_the_message_that_carries_the_key(slack, fake_slack, call):
    for n in range(5):  # other traffic in the channel, before and after
        slack.execute(call({"channel": "C0ACME", "text": f"other {n}"}, creds(fake_slack)))
    fake_slack.drop_next = 1  # posted, but the answer is lost: the ledger cannot know the ts
    lost = call({"channel": "C0ACME", "text": "the one"}, creds(fake_slack))
    with pytest.raises(ConnectorError) as raised:
        slack.execute(lost)
    assert raised.value.sent
    slack.execute(call({"channel": "C0ACME", "text": "after"}, creds(fake_slack)))

    found = slack.lookup(lost)
    assert isinstance(found, Found)
    posted = [m for m in fake_slack.messages["C0ACME"] if m["text"] == "the one"]
    assert found.result == {"channel": "C0ACME", "ts": posted[0]["ts"]}


def test_lookup_pages_through_history(slack, fake_slack, call, monkeypatch):
    monkeypatch.setattr("integrations.connectors.slack.PAGE_SIZE", 2)
    first = call({"channel": "C0ACME", "text": "oldest"}, creds(fake_slack))
    slack.execute(first)
    for n in range(6):
        slack.execute(call({"channel": "C0ACME", "text": f"newer {n}"}, creds(fake_slack)))
    assert isinstance(slack.lookup(first), Found)
    monkeypatch.setattr("django.conf.settings.SLACK_LOOKUP_MAX_PAGES", 2)
    assert slack.lookup(first) is Lookup.UNKNOWN  # not searched to the end: cannot say "absent"


def test_lookup_says_not_found_when_the_message_never_arrived(slack, fake_slack, call):
    slack.execute(call({"channel": "C0ACME", "text": "unrelated"}, creds(fake_slack)))
    never_sent = call({"channel": "C0ACME", "text": "never"}, creds(fake_slack))
    assert slack.lookup(never_sent) is Lookup.NOT_FOUND


def test_lookup_in_a_thread_searches_the_replies(slack, fake_slack, call):
    parent = slack.execute(call({"channel": "C0ACME", "text": "thread"}, creds(fake_slack)))
    reply = call({"channel": "C0ACME", "text": "reply", "thread_ts": parent["ts"]}, creds(fake_slack))
    result = slack.execute(reply)
    assert slack.lookup(reply) == Found(result)


def test_lookup_is_unknown_when_slack_cannot_answer(slack, fake_slack, call):
    attempt = call({"channel": "C0ACME", "text": "x"}, creds(fake_slack))
    assert slack.lookup(attempt) is Lookup.UNKNOWN  # channel_not_found: nothing posted there yet
    slack.execute(call({"channel": "C0ACME", "text": "y"}, creds(fake_slack)))
    fake_slack.ratelimited_next = 1
    assert slack.lookup(attempt) is Lookup.UNKNOWN
    down = call({"channel": "C0ACME", "text": "x"}, {"token": TOKEN, "api_url": "http://127.0.0.1:9/api"})
    assert slack.lookup(down) is Lookup.UNKNOWN


def test_slack_errors_map_to_connector_errors(slack, fake_slack, call):
    fake_slack.ratelimited_next, fake_slack.retry_after = 1, 7
    with pytest.raises(ConnectorError, match=r"ratelimited \(retry after 7s\)") as limited:
        slack.execute(call({"channel": "C0ACME", "text": "x"}, creds(fake_slack)))
    assert limited.value.retryable and not limited.value.sent
    with pytest.raises(ConnectorError, match="invalid_auth") as bad_auth:
        slack.execute(call({"channel": "C0ACME", "text": "x"},
                           {"token": "not-a-token", "api_url": f"{fake_slack.url}/api"}))
    assert not bad_auth.value.retryable
    with pytest.raises(ConnectorError, match="no bot token"):
        slack.execute(call({"channel": "C0ACME", "text": "x"}, {"api_url": fake_slack.url}))
    assert fake_slack.state()["posts"] == 0
