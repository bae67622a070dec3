"""Credentials and TLS of one Pulsar cluster, for both the binary client and the admin REST API.

The same options drive both: a JWT (``auth.token``, else ``$PULSAR_AUTH_TOKEN``) or OAuth2 client credentials
(``auth.oauth2.*``: pulsar-client's ``AuthenticationOauth2`` on the binary side; on the admin side the same
``client_credentials`` grant, asked of the issuer here, because the admin API takes the resulting JWT as a
bearer token), and the trust settings of ``tls.*``. Secrets are read from the options at the moment of use
and never kept in anything that prints.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any, Protocol

from cdc.errors import BackendUnavailableError, OptionError

if TYPE_CHECKING:
    import pulsar
    from pydantic import SecretStr

log = logging.getLogger(__name__)

ENV_AUTH_TOKEN = "PULSAR_AUTH_TOKEN"


class SecurityOptions(Protocol):
    """What the read and the write options say about credentials and TLS."""

    @property
    def service_url(self) -> str: ...

    @property
    def auth_token(self) -> SecretStr | None: ...

    @property
    def oauth2_issuer_url(self) -> str | None: ...

    @property
    def oauth2_private_key(self) -> str | None: ...

    @property
    def oauth2_audience(self) -> str | None: ...

    @property
    def tls_trust_certs_file_path(self) -> str | None: ...

    @property
    def tls_allow_insecure_connection(self) -> bool: ...

    @property
    def tls_hostname_verification(self) -> bool: ...


def token_of(options: SecurityOptions) -> str | None:
    """The token in clear, for the client only (options keep it as a secret that never prints): the
    ``auth.token`` option, else the ``PULSAR_AUTH_TOKEN`` environment variable (the way to keep it out of
    the query's code and of py4j's debug log). ``None`` with OAuth2, which brings its own."""
    if options.auth_token:
        return options.auth_token.get_secret_value()
    if options.oauth2_issuer_url:
        return None
    return os.environ.get(ENV_AUTH_TOKEN) or None


def credential_option(options: SecurityOptions) -> str:
    """The option a refused credential came from, for error messages."""
    if options.oauth2_issuer_url:
        return "auth.oauth2.privateKey"
    if options.auth_token or not os.environ.get(ENV_AUTH_TOKEN):
        return "auth.token"
    return f"auth.token (here: ${ENV_AUTH_TOKEN})"


def key_file_url(path: str) -> str:
    """pulsar-client wants the credentials file as a URL: a bare path becomes ``file://<absolute path>``."""
    if path.startswith(("file://", "data:")):
        return path
    return "file://" + os.path.abspath(os.path.expanduser(path))


def authentication(options: SecurityOptions) -> pulsar.Authentication | None:
    """The binary client's authentication for the options, or ``None``."""
    import pulsar

    if options.oauth2_issuer_url and options.oauth2_private_key:
        params: dict[str, str] = {
            "issuer_url": options.oauth2_issuer_url,
            "private_key": key_file_url(options.oauth2_private_key),
        }
        if options.oauth2_audience:
            params["audience"] = options.oauth2_audience
        return pulsar.AuthenticationOauth2(json.dumps(params))
    token = token_of(options)
    return pulsar.AuthenticationToken(token) if token else None


def ssl_context(options: SecurityOptions) -> ssl.SSLContext:
    """The admin API's TLS context: the same trust, insecure and hostname rules as the binary client."""
    context = ssl.create_default_context(cafile=options.tls_trust_certs_file_path)
    if options.tls_allow_insecure_connection:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif not options.tls_hostname_verification:
        context.check_hostname = False
    return context


class OAuth2Tokens:
    """Access tokens from the OAuth2 issuer (``client_credentials`` grant), cached until shortly before they
    expire. Only the admin API needs this: pulsar-client does the same for the binary protocol itself."""

    _REFRESH_EARLY_S = 30.0

    def __init__(self, issuer_url: str, private_key: str, audience: str | None, context: ssl.SSLContext) -> None:
        self.issuer_url = issuer_url.rstrip("/")
        self._key_url = key_file_url(private_key)
        self.audience = audience
        self._context = context
        self._token: str | None = None
        self._expires = 0.0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"OAuth2Tokens({self.issuer_url!r})"  # never the client secret or a token

    def _credentials(self) -> dict[str, Any]:
        if self._key_url.startswith("data:"):
            with urllib.request.urlopen(self._key_url) as response:  # noqa: S310 - a data: URL, no network
                text = response.read().decode()
        else:
            path = urllib.parse.unquote(urllib.parse.urlparse(self._key_url).path)
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except OSError as exc:
                raise OptionError(
                    f"option 'auth.oauth2.privateKey': cannot read the credentials file {path}: {exc.strerror}",
                    "auth.oauth2.privateKey",
                ) from None
        try:
            creds = json.loads(text)
        except ValueError:
            creds = None
        if not isinstance(creds, dict) or not {"client_id", "client_secret"} <= creds.keys():
            raise OptionError(
                "option 'auth.oauth2.privateKey': the credentials file is not JSON with client_id and client_secret",
                "auth.oauth2.privateKey",
            )
        return creds

    def _json(self, request: urllib.request.Request | str, what: str) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(request, timeout=30, context=self._context) as response:  # noqa: S310
                answer = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code in (400, 401, 403):
                raise OptionError(
                    f"option 'auth.oauth2.privateKey': the OAuth2 issuer {self.issuer_url} refused the client "
                    f"credentials ({what}: HTTP {exc.code})",
                    "auth.oauth2.privateKey",
                ) from None
            raise BackendUnavailableError(f"OAuth2 issuer {self.issuer_url}, {what}: HTTP {exc.code}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, ValueError) as exc:
            raise BackendUnavailableError(f"OAuth2 issuer {self.issuer_url}, {what}: {exc}") from None
        if not isinstance(answer, dict):
            raise BackendUnavailableError(f"OAuth2 issuer {self.issuer_url}, {what}: not a JSON object")
        return answer

    def token(self) -> str:
        with self._lock:
            if self._token is None or time.monotonic() >= self._expires:
                self._token, lifetime = self._grant()
                self._expires = time.monotonic() + max(0.0, lifetime - self._REFRESH_EARLY_S)
            return self._token

    def _grant(self) -> tuple[str, float]:
        creds = self._credentials()
        discovery = self._json(self.issuer_url + "/.well-known/openid-configuration", "discovery")
        endpoint = discovery.get("token_endpoint")
        if not isinstance(endpoint, str):
            raise BackendUnavailableError(f"OAuth2 issuer {self.issuer_url}: its discovery names no token_endpoint")
        form = {"grant_type": "client_credentials", "client_id": creds["client_id"],
                "client_secret": creds["client_secret"]}
        if self.audience:
            form["audience"] = self.audience
        request = urllib.request.Request(
            endpoint,
            data=urllib.parse.urlencode(form).encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"},
        )
        answer = self._json(request, "token request")
        token = answer.get("access_token")
        if not isinstance(token, str):
            raise BackendUnavailableError(f"OAuth2 issuer {self.issuer_url}: the token answer has no access_token")
        log.debug("OAuth2 access token from %s (expires in %s s)", self.issuer_url, answer.get("expires_in"))
        return token, float(answer.get("expires_in") or 3600)
