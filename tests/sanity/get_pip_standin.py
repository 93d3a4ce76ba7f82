"""Offline stand-in for the get-pip script ansible-test uses to bootstrap its sanity venvs.

ansible-test creates every sanity test venv without pip and then runs
``~/.ansible/test/cache/get_pip_<major>_<minor>.py``, downloading it from
ci-files.testing.ansible.com (unreachable here) when that file is missing. scripts/sanity.sh
copies this file to that name next to the matching pip wheel (pinned with its hash in
tests/sanity/requirements.txt). Like the real get-pip.py, it runs pip from the wheel to install
pip into the venv, with the same arguments, but from the local wheel only.
"""

import pathlib
import sys

CACHE_DIR = pathlib.Path(__file__).resolve().parent
# get-pip.py options that pip itself does not know (get-pip drops them the same way).
GET_PIP_ONLY_OPTIONS = {"--no-setuptools", "--no-wheel"}


def requested_pip_version() -> str:
    """The pip version this copy stands in for, taken from its name: get_pip_24_2.py -> 24.2."""
    return pathlib.Path(__file__).stem.removeprefix("get_pip_").replace("_", ".")


def main() -> int:
    wheel = CACHE_DIR / f"pip-{requested_pip_version()}-py3-none-any.whl"
    if not wheel.is_file():
        sys.stderr.write(f"get-pip stand-in: {wheel} is missing; run scripts/sanity.sh\n")
        return 1
    sys.path.insert(0, str(wheel))
    from pip._internal.cli.main import main as pip_main

    pip_args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY_OPTIONS]
    local_only = ["--no-index", "--find-links", str(CACHE_DIR)]
    return pip_main(["install", "--upgrade", "--force-reinstall", *local_only, *pip_args])


if __name__ == "__main__":
    sys.exit(main())
