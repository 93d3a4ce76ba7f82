"""Errors the control plane reports to operators and machines."""

from __future__ import annotations

from typing import Any


class GpuaasError(Exception):
    """An error with a machine-readable code, a human sentence and structured details."""

    def __init__(self, code: str, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details if details is not None else {}

    def as_dict(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class NotFound(GpuaasError):
    def __init__(self, kind: str, key: object) -> None:
        super().__init__(
            f"{kind}_not_found", f"no {kind.replace('_', ' ')} {key!s}", {"key": str(key)}
        )


class InvalidInput(GpuaasError):
    pass


class Conflict(GpuaasError):
    pass
