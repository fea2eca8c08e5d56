"""How to reach Nomad, read from the Nomad CLI's environment variables."""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

DEFAULT_ADDRESS = "http://127.0.0.1:4646"
DEFAULT_NAMESPACE = "default"

REDACTED = "<redacted>"
# A URL's credentials (`user:password@`), up to its last `@`: a password may hold one.
_USERINFO = re.compile(r"(?<=://)\S*@")

# Go's strconv.ParseBool, which the Nomad CLI uses for NOMAD_SKIP_VERIFY.
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


class ConfigError(ValueError):
    """A bad connection setting; the message names the variable and value (never a token
    or a URL's credentials)."""


def scrub(text: str, token: str | None = None) -> str:
    """`text` without `token` and without the credentials of any URL in it
    (`https://user:pw@nomad:4646` is `https://<redacted>@nomad:4646`): what goes into an
    error, a log line or a label from an address or from an answer."""
    if token:
        text = text.replace(token, REDACTED)
    return _USERINFO.sub(REDACTED + "@", text)


def parse_bool(name: str, value: str) -> bool:
    """Parse `value` as Go's strconv.ParseBool does."""
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}: invalid boolean {value!r} (use true or false)")


@dataclass(frozen=True, slots=True)
class _Address:
    scheme: str
    host: str
    port: int


def _parse_address(value: str, name: str = "NOMAD_ADDR") -> _Address:
    def invalid(why: str) -> ConfigError:
        return ConfigError(scrub(f"{name}: invalid address {value!r} ({why})"))

    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise invalid(str(exc)) from None
    if "@" in parts.netloc:
        raise invalid("no credentials in it: the token goes in NOMAD_TOKEN")
    if parts.scheme not in ("http", "https"):
        raise invalid("scheme must be http or https")
    if not parts.hostname:
        raise invalid("no host")
    # A path, query or fragment would be silently dropped or sent to the wrong place.
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise invalid("only scheme://host:port")
    if port is None:
        # As the Go client does: the URL is used as given, so the scheme's port applies.
        port = 443 if parts.scheme == "https" else 80
    return _Address(parts.scheme, parts.hostname, port)


@dataclass(frozen=True)
class NomadConfig:
    """Connection settings. `token` is kept out of repr/str so it cannot reach a log."""

    address: str = DEFAULT_ADDRESS
    token: str | None = field(default=None, repr=False)
    namespace: str = DEFAULT_NAMESPACE
    region: str | None = None
    ca_cert: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    skip_verify: bool = False

    def __post_init__(self) -> None:
        parsed = _parse_address(self.address)
        # Normalised so every user of the config builds the same URLs.
        object.__setattr__(self, "address", _format_address(parsed))
        if self.client_key and not self.client_cert:
            raise ConfigError("NOMAD_CLIENT_KEY is set but NOMAD_CLIENT_CERT is not")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> NomadConfig:
        """Read the Nomad CLI variables; unset and empty mean the same, as in the CLI."""

        def get(name: str) -> str | None:
            value = environ.get(name, "")
            return value or None

        skip = get("NOMAD_SKIP_VERIFY")
        files: dict[str, str | None] = {}
        for name in ("NOMAD_CACERT", "NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY"):
            path = get(name)
            # Fail at start-up with the variable's name, not on every request later.
            if path is not None and not os.path.exists(path):
                raise ConfigError(f"{name}: no such file {path!r}")
            files[name] = path
        return cls(
            address=get("NOMAD_ADDR") or DEFAULT_ADDRESS,
            token=get("NOMAD_TOKEN"),
            namespace=get("NOMAD_NAMESPACE") or DEFAULT_NAMESPACE,
            region=get("NOMAD_REGION"),
            ca_cert=files["NOMAD_CACERT"],
            client_cert=files["NOMAD_CLIENT_CERT"],
            client_key=files["NOMAD_CLIENT_KEY"],
            skip_verify=parse_bool("NOMAD_SKIP_VERIFY", skip) if skip is not None else False,
        )

    def redact(self, text: str) -> str:
        """`text` without the token or a URL's credentials (`scrub`)."""
        return scrub(text, self.token)

    @property
    def scheme(self) -> str:
        return _parse_address(self.address).scheme

    @property
    def host(self) -> str:
        return _parse_address(self.address).host

    @property
    def port(self) -> int:
        return _parse_address(self.address).port

    @property
    def secure(self) -> bool:
        return self.scheme == "https"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of every connection to Nomad (API calls and the event stream);
        None for http. Trusts NOMAD_CACERT (a file or a folder), else certifi's roots, as
        the Nomad CLI trusts the system's."""
        if not self.secure:
            return None
        if self.skip_verify:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_cert and os.path.isdir(self.ca_cert):
            ctx = ssl.create_default_context(capath=self.ca_cert)
        elif self.ca_cert:
            ctx = ssl.create_default_context(cafile=self.ca_cert)
        else:
            import certifi

            ctx = ssl.create_default_context(cafile=certifi.where())
        if self.client_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx


def _format_address(addr: _Address) -> str:
    host = addr.host
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass
    return f"{addr.scheme}://{host}:{addr.port}"
