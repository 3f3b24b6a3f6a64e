"""Google OIDC tokens of Pub/Sub push requests: RS256 signature against Google's keys, issuer,
audience, service-account email, email_verified (PyJWT).

Keys come from settings.GOOGLE_OIDC_JWKS when set (tests sign with a local key configured
there; nothing is fetched), else from GOOGLE_OIDC_CERTS_URL, fetched with a timeout and cached.
"""

import json
import threading
import time
import urllib.request

import jwt
from django.conf import settings

from agentplatform.errors import ServiceError

ISSUERS = ["accounts.google.com", "https://accounts.google.com"]


class TokenRejected(ServiceError):
    """A push's OIDC token refused (or Google's keys out of reach); the code says which."""


_lock = threading.Lock()
_cache: dict = {"source": None, "keys": {}, "fetched": 0.0}


def _jwks_load() -> dict:
    if settings.GOOGLE_OIDC_JWKS:
        return json.loads(settings.GOOGLE_OIDC_JWKS)

    with urllib.request.urlopen(settings.GOOGLE_OIDC_CERTS_URL,
                                timeout=settings.GOOGLE_OIDC_FETCH_TIMEOUT_SECONDS) as response:
        return json.loads(response.read())


REFRESH_MIN_SECONDS = 60


def signing_keys(*, refresh: bool = False) -> dict:
    """kid -> public key; cached for GOOGLE_OIDC_CACHE_SECONDS (per configured source)."""
    source = settings.GOOGLE_OIDC_JWKS or settings.GOOGLE_OIDC_CERTS_URL
    with _lock:
        age = time.monotonic() - _cache["fetched"]
        fresh = age < settings.GOOGLE_OIDC_CACHE_SECONDS
        # A token with an unknown kid may ask for one refresh, at most once a minute: forged
        # kids must not make us fetch Google's keys on every request.
        refresh = refresh and age >= REFRESH_MIN_SECONDS
        if refresh or _cache["source"] != source or not fresh:
            try:
                jwks = jwt.PyJWKSet.from_dict(_jwks_load())
            except Exception as exc:
                raise TokenRejected("oidc_keys_unavailable",
                                    f"Google's signing keys are unavailable: {exc}") from exc
            _cache.update(source=source, fetched=time.monotonic(),
                          keys={k.key_id: k.key for k in jwks.keys})
        return _cache["keys"]


def google_token_verify(*, token: str, audience: str, email: str) -> dict:
    """The token's claims if it is a valid Google OIDC token for `audience` issued to the
    service account `email`; otherwise TokenRejected."""
    try:
        kid = jwt.get_unverified_header(token).get("kid")
    except jwt.PyJWTError as exc:
        raise TokenRejected("invalid_token", f"The bearer token is not a JWT: {exc}") from None
    keys = signing_keys()
    if kid not in keys:  # Google rotates keys: one refresh before refusing
        keys = signing_keys(refresh=True)
    if kid not in keys:
        raise TokenRejected("invalid_token", "The token is signed by an unknown key.")
    try:
        claims = jwt.decode(token, keys[kid], algorithms=["RS256"], audience=audience,
                            issuer=ISSUERS, leeway=30,
                            options={"require": ["exp", "iat", "iss", "aud", "email"]})
    except jwt.PyJWTError as exc:
        raise TokenRejected("invalid_token", f"The token is not valid: {exc}") from None
    if claims.get("email") != email or claims.get("email_verified") is not True:
        raise TokenRejected("wrong_identity",
                            "The token was not issued to this connection's service account.")
    return claims
