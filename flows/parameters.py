"""Flow parameter types as the Prefect run form shows them.

Prefect writes an optional parameter (``str | None``) into the deployment's schema as
``anyOf: [string, null]``, which the run form shows without a type and with a
"Property is type None" choice. These aliases keep the union for validation and give the
form the plain type; a field left empty keeps the parameter's default.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import WithJsonSchema

OptionalText = Annotated[str | None, WithJsonSchema({"type": "string"})]
OptionalNames = Annotated[
    list[str] | None, WithJsonSchema({"type": "array", "items": {"type": "string"}})
]
OptionalIndexes = Annotated[
    list[int] | None, WithJsonSchema({"type": "array", "items": {"type": "integer"}})
]
ExtraVars = Annotated[
    dict[str, Any] | None, WithJsonSchema({"type": "object", "additionalProperties": True})
]
