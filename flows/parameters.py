"""How the flows' optional parameters are written, for the Prefect run form.

An optional parameter written ``str | None = None`` reaches the deployment's schema as
``anyOf: [string, null]``, which the run form shows without a type and with a "Property is
type None" choice; a schema admitting null by a list of types gets no input at all, and a
plain type with a null default makes the server refuse the form's own null. So optional
parameters have defaults of their own type: an empty text or list means "not given", and
extra variables default to an empty object. Those defaults are lists and dicts (``noqa:
B006``): the flows never change a parameter in place, they build new values from it.
"""

from __future__ import annotations


def given(value: str) -> str | None:
    """An optional text parameter for the control plane: None when left empty."""
    return value or None
