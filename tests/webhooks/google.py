"""A local stand-in for Google's OIDC signer: an RSA key whose JWKS the tests trust."""

import base64
import json
import time

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa


class Signer:
    def __init__(self, kid: str = "test-key-1"):
        self.kid = kid
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwks(self) -> str:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return json.dumps({"keys": [{**jwk, "kid": self.kid, "alg": "RS256", "use": "sig"}]})

    def token(self, *, audience: str, email: str, issuer: str = "https://accounts.google.com",
              expires_in: int = 3600, email_verified: bool = True, kid: str | None = None) -> str:
        now = int(time.time())
        claims = {"iss": issuer, "aud": audience, "email": email, "email_verified": email_verified,
                  "sub": "1137742644630383", "azp": "1137742644630383", "iat": now - 5,
                  "exp": now + expires_in}
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": kid or self.kid})


def push_body(mailbox: str, message_id: str, history_id: int = 9876) -> bytes:
    data = base64.b64encode(json.dumps({"emailAddress": mailbox,
                                        "historyId": history_id}).encode()).decode()
    return json.dumps({"message": {"data": data, "messageId": message_id,
                                   "message_id": message_id,
                                   "publishTime": "2026-01-01T00:00:00Z"},
                       "subscription": "projects/p/subscriptions/gmail-push"}).encode()
