"""Placement keyed by request id: one allocation per request, however often and however
concurrently it is sent (real PostgreSQL)."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.errors import Conflict
from controlplane.scheduler.placement import Placement, PlacementRequest, Unavailable
from controlplane.services.requests import REQUEST_NAMESPACE, PlacedRequest, allocation_id_for
from gpuaas_lab.synthetic import FleetSpec, create_fleet

SLICE = "h200-sxm-slice"


@pytest.fixture
def cp(engine) -> ControlPlane:
    create_fleet(engine, FleetSpec(nodes=2, prefix="r"))
    made = ControlPlane(engine)
    for project in ("p1", "p2"):
        made.create_project(project)
    return made


def request(gpus: int, project: str | None = "p1") -> PlacementRequest:
    return PlacementRequest(sku=SLICE, gpu_count=gpus, project_id=project, requested_by="t")


def allocations(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM allocations")).scalar_one()


def test_a_repeated_request_replays_its_allocation(cp, engine):
    first = cp.place_request(request(2), "req-1", flow_run_id="run-a")
    again = cp.place_request(request(2), "req-1", flow_run_id="run-b")

    assert isinstance(first, PlacedRequest) and isinstance(first.placement, Placement)
    assert first.placed and not first.replayed
    assert first.allocation_id == str(allocation_id_for("req-1", "p1"))
    assert again.replayed and again.allocation_id == first.allocation_id
    assert again.placement is None
    assert (again.node, again.state) == (first.node, "pending")
    assert sorted(again.slot_indexes) == sorted(first.slot_indexes)
    assert again.flow_run_id == "run-a"
    assert again.as_dict()["slots"] == [{"slot_index": i} for i in again.slot_indexes]
    assert first.as_dict()["flow_run_id"] == "run-a" and not first.as_dict()["replayed"]
    shown = cp.show_allocation(uuid.UUID(first.allocation_id))
    assert shown.runtime_metadata["flow_run_id"] == "run-a"
    assert allocations(engine) == 1


def test_a_request_id_is_scoped_by_project(cp, engine):
    one = cp.place_request(request(1, "p1"), "same")
    other = cp.place_request(request(1, "p2"), "same")
    assert one.allocation_id != other.allocation_id
    assert not other.replayed and allocations(engine) == 2


def test_a_request_id_reused_for_another_size_is_refused_and_places_nothing(cp, engine):
    cp.place_request(request(2), "req-2")
    with pytest.raises(Conflict) as refused:
        cp.place_request(request(4), "req-2")
    assert refused.value.code == "request_id_reused"
    assert allocations(engine) == 1


def test_a_replay_answers_even_when_the_fleet_has_filled_since(cp, engine):
    first = cp.place_request(request(8), "big")
    while cp.place(request(8)).placed:
        pass
    assert isinstance(cp.place_request(request(8), "another"), Unavailable)
    again = cp.place_request(request(8), "big")
    assert again.placed and again.allocation_id == first.allocation_id


def test_concurrent_attempts_of_one_request_place_one_allocation(cp, engine):
    barrier = threading.Barrier(6)
    answers: list[PlacedRequest] = []
    errors: list[BaseException] = []

    def attempt() -> None:
        barrier.wait()
        try:
            answers.append(cp.place_request(request(1), "racy"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=attempt) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert {a.allocation_id for a in answers} == {str(allocation_id_for("racy", "p1"))}
    assert sum(not a.replayed for a in answers) == 1
    assert allocations(engine) == 1


@pytest.mark.parametrize("first_project, then_project", [(None, "default"), ("default", None)])
def test_a_request_id_is_one_allocation_however_the_default_project_is_spelled(
    cp, engine, first_project, then_project
):
    first = cp.place_request(request(1, first_project), "r-43")
    again = cp.place_request(request(1, then_project), "r-43")
    assert not first.replayed and again.replayed
    assert again.allocation_id == first.allocation_id == str(allocation_id_for("r-43", "default"))
    assert allocations(engine) == 1


@pytest.mark.parametrize("project", [None, "default"])
def test_a_request_stored_before_the_project_was_normalised_still_replays(cp, engine, project):
    # The id a request naming no project was given then: the project left empty.
    stored = uuid.uuid5(REQUEST_NAMESPACE, "/r-old")
    placed = cp.place(
        PlacementRequest(sku=SLICE, gpu_count=1, requested_by="t", allocation_id=stored)
    )
    assert isinstance(placed, Placement)

    again = cp.place_request(request(1, project), "r-old", flow_run_id="run-c")
    assert again.replayed and again.allocation_id == str(stored)
    assert again.flow_run_id == "run-c"
    assert cp.show_allocation(stored).runtime_metadata["flow_run_id"] == "run-c"
    assert allocations(engine) == 1
