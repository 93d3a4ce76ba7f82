"""The parameters of the scheduler's statements for a plain request (default project, no
region, image, hugepages, fabric, quota or reservation in play), shared by the tests that
explain its plans."""

from __future__ import annotations

PLAN_PARAMS = {
    "family": "h200-sxm",
    "region": None,
    "salt": "plan",
    "k": 16,
    "offset": 0,
    "image_id": None,
    "image_required": False,
    "avoid_regions": [],
    "allowed_regions": None,
    "project": "default",
    "respect_reservations": True,
    "own_reserved_only": False,
    "hugepages_gib": None,
    "fabric": "any",
}
