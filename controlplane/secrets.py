"""Evidence and run artifacts never store secrets: one place that knows what a secret looks
like (by key name, by known value, as a URL's password) and how to hand one to libpq."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

SECRET_KEYS = frozenset(
    {
        "password",
        "passwd",
        "token",
        "secret",
        "private_key",
        "api_key",
        "api_token",
        "ansible_password",
        "ansible_become_password",
        "ansible_ssh_private_key_file",
    }
)
# Environment variable names (lowercased) holding secrets beyond SECRET_KEYS' rules.
SECRET_ENV_WORDS = (
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "private_key",
    "auth_string",
    "credential",
)
SCRUBBED = "<scrubbed>"
# Shorter values are not searched for in text: replacing them would mangle unrelated data.
MIN_REDACTED_LENGTH = 4
# scheme://user:password@ — the password is group 2.
URL_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)([^\s@/]+)(@)")


def is_secret_key(key: str) -> bool:
    lowered = key.lower()
    return lowered in SECRET_KEYS or lowered.endswith(
        ("_password", "_token", "_secret", "_private_key")
    )


def is_secret_env(name: str) -> bool:
    lowered = name.lower()
    return (
        is_secret_key(lowered)
        or lowered.endswith("_key")
        or any(word in lowered for word in SECRET_ENV_WORDS)
    )


def scrub(value: Any) -> Any:
    """A copy of ``value`` with every secret-looking key's value replaced, at any depth."""
    if isinstance(value, dict):
        return {k: (SCRUBBED if is_secret_key(str(k)) else scrub(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def _scalars(value: Any) -> Iterable[str]:
    if isinstance(value, Mapping):
        for item in value.values():
            yield from _scalars(item)
    elif isinstance(value, (list, tuple, set)):
        for item in value:
            yield from _scalars(item)
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def secret_values(value: Any) -> set[str]:
    """Every scalar held under a secret-looking key of ``value``, at any depth, and every
    password of a URL inside it: the strings to look for wherever the data may have gone."""
    found: set[str] = set()
    if isinstance(value, Mapping):
        for key, item in value.items():
            if is_secret_key(str(key)):
                found.update(_scalars(item))
            else:
                found |= secret_values(item)
    elif isinstance(value, (list, tuple, set)):
        for item in value:
            found |= secret_values(item)
    elif isinstance(value, str):
        found.update(m.group(2) for m in URL_CREDENTIALS.finditer(value))
    return {s for s in found if s}


def environment_secrets(environment: Mapping[str, str]) -> set[str]:
    """Values of secret-named variables and passwords of URLs in any variable."""
    found = {v for k, v in environment.items() if v and is_secret_env(k)}
    for value in environment.values():
        found |= secret_values(value)
    return found


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with URL passwords and every known secret (as written, or JSON-escaped)
    replaced."""
    text = URL_CREDENTIALS.sub(lambda m: m.group(1) + SCRUBBED + m.group(3), text)
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) < MIN_REDACTED_LENGTH:
            continue
        for form in {secret, _json_escaped(secret)}:
            text = text.replace(form, SCRUBBED)
    return text


def _json_escaped(secret: str) -> str:
    return json.dumps(secret)[1:-1]


def redact(value: Any, secrets: Iterable[str]) -> Any:
    """A copy of ``value`` with secret-looking keys scrubbed and known secret values
    replaced inside every string."""
    known = frozenset(secrets)
    if isinstance(value, dict):
        return {
            k: (SCRUBBED if is_secret_key(str(k)) else redact(v, known)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v, known) for v in value]
    if isinstance(value, str):
        return redact_text(value, known)
    return value


def split_secret_vars(variables: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(public, secret): a top-level variable is secret when its name is, or when it holds
    a secret-looking key or a URL password anywhere inside."""
    public: dict[str, Any] = {}
    secret: dict[str, Any] = {}
    for key, value in variables.items():
        holds_secret = is_secret_key(str(key)) or secret_values(value)
        (secret if holds_secret else public)[key] = value
    return public, secret


def pgpass_line(password: str) -> str:
    """A libpq password file line matching any server, database and user (the file is
    private to one run): ``:`` and ``\\`` are escaped as libpq expects."""
    escaped = password.replace("\\", "\\\\").replace(":", "\\:")
    return f"*:*:*:*:{escaped}\n"
