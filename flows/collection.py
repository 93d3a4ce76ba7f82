"""Where the flows find the ``gpuaas.fleet`` collection whose playbooks they run, and the
Ansible settings they run them with: the collection's own ansible.cfg (docs/operations.md,
"Adding a controller from the release artifacts").

In order: the collections paths in ``GPUAAS_COLLECTIONS_PATH`` when it is set (and only
there); this checkout, which scripts/setup.sh exposes under .collections; then Ansible's
own search, as its collection loader makes it (its configured collections path, then
Python's sys.path), where ``ansible-galaxy collection install`` put the release tarball.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from controlplane.errors import GpuaasError

COLLECTIONS_PATH_ENV = "GPUAAS_COLLECTIONS_PATH"
NAMESPACE = "gpuaas"
NAME = "fleet"
CHECKOUT_COLLECTIONS = Path(__file__).resolve().parent.parent / ".collections"


@dataclass(frozen=True)
class Collection:
    """An installed copy: ``collections_path`` holds ``ansible_collections/``, ``root`` is
    the collection's own directory (resolved: in a checkout, the checkout)."""

    collections_path: Path
    root: Path

    @property
    def playbooks(self) -> Path:
        return self.root / "playbooks"

    @property
    def config(self) -> Path:
        return self.root / "ansible.cfg"


def collection_in(collections_path: Path) -> Collection | None:
    root = collections_path / "ansible_collections" / NAMESPACE / NAME
    if not (root / "playbooks").is_dir():
        return None
    return Collection(collections_path, root.resolve())


def ansible_search_path() -> list[Path]:
    """Where Ansible's collection loader looks, in its order."""
    from ansible import constants

    paths = [Path(p) for p in constants.COLLECTIONS_PATHS]
    if constants.COLLECTIONS_SCAN_SYS_PATH:
        paths += [Path(p) for p in sys.path if p]
    return paths


def find_collection() -> Collection:
    explicit = os.environ.get(COLLECTIONS_PATH_ENV)
    if explicit:
        searched = [Path(p) for p in explicit.split(os.pathsep) if p]
        where = f"{COLLECTIONS_PATH_ENV} ({explicit})"
    else:
        checkout = collection_in(CHECKOUT_COLLECTIONS)
        if checkout is not None:
            return checkout
        searched = ansible_search_path()
        where = "Ansible's collections path and Python's sys.path"
    for path in searched:
        found = collection_in(path)
        if found is not None:
            return found
    raise GpuaasError(
        "collection_not_found",
        f"no {NAMESPACE}.{NAME} collection with playbooks in {where}: install the release "
        f"tarball with ansible-galaxy collection install, or set {COLLECTIONS_PATH_ENV} to "
        "the directory it was installed into (docs/operations.md)",
        {"searched": [str(p) for p in searched]},
    )
