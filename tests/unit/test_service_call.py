"""controlplane/api/boundary.py: a service function made a control-plane method runs in
one transaction of its own and shows the service's signature less the session."""

from __future__ import annotations

import contextlib
import inspect

from controlplane.api import ControlPlane
from controlplane.api.boundary import ServiceBoundary, service_call
from controlplane.services import projects


def rename(session, project_id: str, name: str | None = None, *, actor: str = "api") -> tuple:
    """Give the project a name."""
    return session, project_id, name, actor


class Boundary(ServiceBoundary):
    """A boundary whose transactions are numbered, instead of an engine's."""

    rename = service_call(rename)

    def __init__(self) -> None:
        self.opened: list[str] = []

    @contextlib.contextmanager
    def transaction(self):
        self.opened.append(f"session {len(self.opened) + 1}")
        yield self.opened[-1]


def test_each_call_is_the_service_in_a_transaction_of_its_own():
    boundary = Boundary()
    assert boundary.rename("p1", actor="op") == ("session 1", "p1", None, "op")
    assert boundary.rename("p2", "Two") == ("session 2", "p2", "Two", "api")
    assert boundary.opened == ["session 1", "session 2"]


def test_the_method_shows_the_services_signature_less_the_session():
    assert str(inspect.signature(Boundary.rename)) == (
        "(self, project_id: 'str', name: 'str | None' = None, *, actor: 'str' = 'api') -> 'tuple'"
    )
    assert str(inspect.signature(Boundary().rename)).startswith("(project_id: 'str',")
    assert Boundary.rename.__doc__ == "Give the project a name."


def test_a_control_plane_call_keeps_the_services_keywords_and_defaults():
    parameters = inspect.signature(ControlPlane.retire_project).parameters
    service = inspect.signature(projects.retire).parameters
    assert list(parameters)[1:] == list(service)[1:]
    assert parameters["actor"].kind is inspect.Parameter.KEYWORD_ONLY
    assert parameters["with_live_allocations"].default is False
