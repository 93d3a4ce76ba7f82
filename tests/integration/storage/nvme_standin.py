"""A stand-in for nvme-cli, for the one boundary this machine cannot cross: NVMe hardware.

Installed by tests as an `nvme` executable on PATH. Its configuration is the JSON file named
by GPUAAS_NVME_STANDIN:

    {"id_ctrl": {...}, "id_ns": {...},      # recorded `nvme id-ctrl/id-ns -o json` documents
     "log": "/path/nvme-argv.jsonl",        # every invocation's argv is appended here
     "format_zeroes": "whole"}              # what `nvme format` zeroes on the device given:
                                            # "whole", "second_half" or "nothing"

`nvme format <block device> --ses=N ...` really writes the device it is given (a loop
device), so whatever the module verifies afterwards it reads from a real block device. It
exits 0 whatever it zeroed, as a drive with faulty firmware would.
"""

from __future__ import annotations

import json
import os
import stat
import sys

CHUNK = 4 * 1024 * 1024
ZEROED_FROM = {"whole": 0.0, "second_half": 0.5, "nothing": 1.0}


def block_device(path: str) -> bool:
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False


def zero(path: str, start_fraction: float) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        offset = int(size * start_fraction) // 4096 * 4096
        zeros = bytes(CHUNK)
        while offset < size:
            offset += os.pwrite(fd, zeros[: min(CHUNK, size - offset)], offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    with open(os.environ["GPUAAS_NVME_STANDIN"], encoding="utf-8") as handle:
        config = json.load(handle)
    with open(config["log"], "a", encoding="utf-8") as log:
        log.write(json.dumps(argv) + "\n")
    command, device = [*argv, "", ""][:2]
    if not block_device(device):
        print(f"{device}: not a block device", file=sys.stderr)
        return 1
    if command in ("id-ctrl", "id-ns"):
        if "-o" not in argv or argv[argv.index("-o") + 1 :][:1] != ["json"]:
            print("the stand-in answers -o json only", file=sys.stderr)
            return 1
        print(json.dumps(config[command.replace("-", "_")]))
        return 0
    if command == "format":
        ses = [a.split("=", 1)[1] for a in argv if a.startswith("--ses=")]
        if ses not in (["0"], ["1"], ["2"]) or "--force" not in argv:
            print("format needs one --ses=0|1|2 and --force", file=sys.stderr)
            return 1
        zero(device, ZEROED_FROM[config["format_zeroes"]])
        print(f"Success formatting namespace:1 (ses={ses[0]})")
        return 0
    print(f"the stand-in does not implement {command!r}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
