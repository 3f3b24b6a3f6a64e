"""Secrets out of texts that people read: `secrets_redact(text)` for every error text that is
built or stored (connector errors, run events, effect and outbox rows, the run's error) and
`SecretsRedactingFilter` for log records. Imports no app, so every layer can use it.

What goes: a URL's `user:password@` (everything between `://` and the authority's last `@`,
whatever the characters: a password may hold quotes or spaces), every query value of a URL or of
a bare `/path?query` (`?token=`, `key=`, `sig=`...), secret-looking path segments (Slack's
`/services/T…/B…/…`, long random segments), and bearer tokens / Slack and Stripe keys written
bare.
"""

import logging
import re

REDACTED = "[redacted]"

# Every repeated part that a regex scans from many starting points is bounded (a scheme 32
# characters, a bare target's path 1024, a bare user or password 256): unbounded, a long run
# that never matches (80,000 characters of "a:", "-/" or "-a") was scanned to its end from each
# start, seconds of a worker's time on one error text.
# a URL ends before whitespace, quotes, and the punctuation of the sentence around it
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]{0,31}://[^\s'\"<>`]*[^\s'\"<>`:.,;)\]]")
_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]{0,31}://)[^/?#]*@")
# the authority's userinfo before the URL is cut out of its sentence: up to the last @ on the line
_ANY_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]{0,31}://)[^/?#\r\n]*@")
# a request target written without scheme and host (`GET /hook?token=...`)
_BARE_TARGET = re.compile(r"(?<![\w.:/@\]])(/[^\s'\"<>?#]{0,1024}\?)([^\s'\"<>#]*)")
_QUERY_VALUE = re.compile(r"([?&;][^=&#;?]*=)[^&#;]*")
_SLACK_HOOK = re.compile(r"(/services)/[^?#]+")
# A path segment of 20+ characters with letters and digits in it, or 20 letters in a row (no
# word is that long), looks like a token.
_SECRET_SEGMENT = re.compile(r"(?<=/)(?:(?=[^/?#]*[0-9])(?=[^/?#]*[A-Za-z])|(?=[^/?#]*[A-Za-z]{20}))"
                             r"[A-Za-z0-9_\-.~%]{20,}(?=[/?#]|$)")
_BARE_TOKENS = re.compile(
    r"(?i)(\bbearer\s+)[^\s'\",]+"
    r"|\bxox[abposr]-[A-Za-z0-9-]+"
    r"|\b[sr]k_(?:live|test)_[A-Za-z0-9]+"
    r"|\bsk-[A-Za-z0-9_-]{16,}")
# user:password@host without a scheme, as a netloc is printed on its own
_BARE_USERINFO = re.compile(
    r"(?<![\w/@.])[^\s/@:'\"]{1,256}:[^\s/@'\"]{1,256}@(?=[A-Za-z0-9\[])")


def _url_redact(match: re.Match) -> str:
    url = match.group(0)
    url = _USERINFO.sub(rf"\1{REDACTED}@", url)
    url, hash_, fragment = url.partition("#")
    base, question, query = url.partition("?")
    scheme_end = base.find("://") + 3
    slash = base.find("/", scheme_end)
    netloc, path = (base, "") if slash < 0 else (base[:slash], base[slash:])
    path = _SLACK_HOOK.sub(rf"\1/{REDACTED}", path)
    path = _SECRET_SEGMENT.sub(REDACTED, path)
    if question:
        query = _QUERY_VALUE.sub(rf"\1{REDACTED}", "?" + query)[1:]
    return netloc + path + question + query + (hash_ + REDACTED if fragment else "")


def secrets_redact(text: str) -> str:
    """`text` with credentials and secret parts of URLs replaced by `[redacted]`."""
    if not text:
        return text
    text = _ANY_USERINFO.sub(rf"\1{REDACTED}@", text)
    text = _URL.sub(_url_redact, text)
    text = _BARE_TARGET.sub(
        lambda m: m.group(1) + _QUERY_VALUE.sub(rf"\1{REDACTED}", "?" + m.group(2))[1:], text)
    text = _BARE_TOKENS.sub(lambda m: (m.group(1) or "") + REDACTED, text)
    return _BARE_USERINFO.sub(f"{REDACTED}@", text)


def secrets_redact_data(value):
    """The same for every string inside a JSON-like value (a run event's data)."""
    if isinstance(value, str):
        return secrets_redact(value)
    if isinstance(value, dict):
        return {key: secrets_redact_data(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [secrets_redact_data(item) for item in value]
    return value


class SecretsRedactingFilter(logging.Filter):
    """Log handlers' filter: the formatted message (and traceback) pass through secrets_redact."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001  (bad arguments: the handler reports it, as without us)
            return True
        redacted = secrets_redact(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = secrets_redact(record.exc_text)
        return True
