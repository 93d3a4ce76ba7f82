"""Evidence never stores secrets: one place that knows what a secret looks like."""

from __future__ import annotations

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
SCRUBBED = "<scrubbed>"


def is_secret_key(key: str) -> bool:
    lowered = key.lower()
    return lowered in SECRET_KEYS or lowered.endswith(("_password", "_token", "_secret"))


def scrub(value: Any) -> Any:
    """A copy of ``value`` with every secret-looking key's value replaced, at any depth."""
    if isinstance(value, dict):
        return {k: (SCRUBBED if is_secret_key(str(k)) else scrub(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value
