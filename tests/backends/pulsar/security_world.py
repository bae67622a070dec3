"""What the security tests need around a secured Apache Pulsar: certificates, JWTs, an OAuth2 token endpoint.

Everything is made here, on loopback: a CA and a server certificate for ``localhost``/``127.0.0.1`` (the
``cryptography`` package), an HS256 secret the broker verifies tokens with (PyJWT signs them), and a tiny
OAuth2 authorization server. The last one stands in for a real identity provider (Auth0, Keycloak...), which
cannot run here: it speaks the part of OAuth2 that pulsar-client uses (OpenID discovery, then the
``client_credentials`` grant) and issues JWTs signed with the broker's secret, which the real broker
verifies like any token.
"""

from __future__ import annotations

import json
import secrets
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt

from cdc.servers.pulsar.standalone import ApachePulsar
from tests.tls import Certificates as Certificates
from tests.tls import make_certificates as make_certificates

SUPER_USER = "cdc-admin"
CLIENT_ROLE = "cdc-client"
OAUTH_CLIENT_ID = "cdc-spark"
OAUTH_AUDIENCE = "urn:cdc-tunnel:pulsar"


def make_other_ca(directory: Path) -> Path:
    """The CA of a different test run: a client that trusts only it must refuse the broker."""
    other = make_certificates(directory)
    return other.ca


@dataclass(frozen=True)
class TokenSigner:
    """Signs the broker's JWTs (HS256 over ``tokenSecretKey``: Pulsar's symmetric-key token mode)."""

    secret: bytes
    path: Path  # the secret key file the broker reads

    def token(self, role: str, **claims: Any) -> str:
        return jwt.encode({"sub": role, **claims}, self.secret, algorithm="HS256")


def make_signer(directory: Path) -> TokenSigner:
    secret = secrets.token_bytes(32)
    path = directory / "secret.key"
    path.write_bytes(secret)
    return TokenSigner(secret, path)


def secured_broker(directory: Path, certs: Certificates, signer: TokenSigner) -> ApachePulsar:
    """An Apache Pulsar standalone with TLS ports, token authentication and authorization on (not started)."""
    admin_token = signer.token(SUPER_USER)
    conf = {
        "authenticationEnabled": "true",
        "authenticationProviders": "org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
        "tokenSecretKey": f"file://{signer.path}",
        "authorizationEnabled": "true",
        "superUserRoles": SUPER_USER,
        # the standalone's own clients (namespace set-up, the broker's internal admin) need a credential too
        "brokerClientAuthenticationPlugin": "org.apache.pulsar.client.impl.auth.AuthenticationToken",
        "brokerClientAuthenticationParameters": f"token:{admin_token}",
        "tlsCertificateFilePath": str(certs.cert),
        "tlsKeyFilePath": str(certs.key),
        "tlsTrustCertsFilePath": str(certs.ca),
    }
    return ApachePulsar(directory / "broker", conf=conf, tls=True, admin_token=admin_token)


class OAuthServer:
    """An OAuth2 authorization server on loopback: OpenID discovery and the ``client_credentials`` grant,
    issuing JWTs for ``CLIENT_ROLE`` signed with the broker's secret. Records each grant's form."""

    def __init__(self, signer: TokenSigner, client_secret: str) -> None:
        self.signer = signer
        self.client_secret = client_secret
        self.grants: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
                pass

            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/.well-known/openid-configuration":
                    self._answer(200, {"issuer": server.url, "token_endpoint": server.url + "/oauth/token"})
                else:
                    self._answer(404, {"error": "not_found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
                server.grants.append(form)
                if form.get("grant_type") != "client_credentials" or form.get("client_id") != OAUTH_CLIENT_ID or (
                    form.get("client_secret") != server.client_secret
                ):
                    self._answer(401, {"error": "invalid_client"})
                    return
                token = server.signer.token(CLIENT_ROLE, aud=form.get("audience", ""))
                self._answer(200, {"access_token": token, "token_type": "Bearer", "expires_in": 3600})

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"

    def credentials_file(self, directory: Path, client_secret: str | None = None) -> Path:
        """The credentials file pulsar-client reads (``private_key``): client id and secret."""
        path = directory / f"credentials-{secrets.token_hex(4)}.json"
        path.write_text(
            json.dumps({"type": "client_credentials", "client_id": OAUTH_CLIENT_ID,
                        "client_secret": client_secret or self.client_secret, "issuer_url": self.url})
        )
        return path

    @contextmanager
    def running(self) -> Iterator[OAuthServer]:
        thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._http.shutdown()
            self._http.server_close()
