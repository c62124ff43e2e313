"""The Redis state store's options, checked: the server URL (redis-py's parsing plus ours),
TLS, the key prefix, counts and durations. Errors name the option and never show a password.
"""

from __future__ import annotations

import math
from typing import Any, cast
from urllib.parse import urlsplit

from redis.connection import SSLConnection, parse_url

_SCHEMES = ("redis", "rediss", "unix")
_CERT_REQS = ("required", "optional", "none")


def connection_kwargs(url: str, username: str | None, password: str | None) -> dict[str, Any]:
    """redis-py's own URL parsing, with our checks and with the username/password options
    taking precedence (redis-py's from_url lets the URL win)."""
    if not isinstance(url, str) or urlsplit(url).scheme not in _SCHEMES:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"url must start with redis://, rediss:// or unix://, got {hide_password(url)!r}")
    parts = urlsplit(url)
    if parts.scheme != "unix" and parts.path.strip("/") and not parts.path.strip("/").isdigit():
        raise ValueError(f"the database in url must be a number (e.g. /0), got {parts.path!r}")
    try:
        kwargs: dict[str, Any] = parse_url(url)
    except ValueError as exc:
        raise ValueError(f"bad url {hide_password(url)!r}: {exc}") from exc
    for option, value in (("username", username), ("password", password)):
        if value is not None:
            if not isinstance(value, str):  # pyright: ignore[reportUnnecessaryIsInstance]
                raise ValueError(f"{option} must be a string")
            kwargs[option] = value
    return kwargs


def describe_server(url: str, connection: dict[str, Any]) -> str:
    """How errors name the server: scheme, host, port and database, never credentials."""
    scheme = urlsplit(url).scheme
    if scheme == "unix":
        return f"Redis at unix://{connection.get('path', '')}"
    host = connection.get("host", "localhost")
    return f"Redis at {scheme}://{host}:{connection.get('port', 6379)}/{connection.get('db', 0)}"


def hide_password(url: object) -> object:
    if not isinstance(url, str):
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def apply_tls(
    connection: dict[str, Any],
    url: str,
    *,
    ca_certs: str | None,
    certfile: str | None,
    keyfile: str | None,
    cert_reqs: str,
) -> None:
    """Add the TLS options to a `rediss://` url's connection arguments; refuse them for any
    other url (they would be silently ignored)."""
    ssl = {
        k: v
        for k, v in {"ssl_ca_certs": ca_certs, "ssl_certfile": certfile, "ssl_keyfile": keyfile}.items()
        if v is not None
    }
    if cert_reqs not in _CERT_REQS:
        raise ValueError(f"ssl_cert_reqs must be one of {', '.join(_CERT_REQS)}, got {cert_reqs!r}")
    if connection.get("connection_class") is SSLConnection:
        connection.update(ssl, ssl_cert_reqs=cert_reqs)
    elif ssl or cert_reqs != "required":
        raise ValueError(f"TLS options {sorted(ssl) or ['ssl_cert_reqs']} need a rediss:// url, got {url!r}")


def check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or not prefix or any(c.isspace() for c in prefix):
        raise ValueError(f"key_prefix must be a non-empty string without spaces, got {prefix!r}")
    return prefix


def check_int(value: object, option: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{option} must be an int >= 0, got {value!r}")
    return value


def check_seconds(value: object, option: str, *, allow_zero: bool) -> float:
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > 0 or (allow_zero and value == 0))
    )
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{option} must be a number of seconds {bound}, got {value!r}")
    return float(cast(float, value))
