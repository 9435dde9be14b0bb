"""The `vkspec` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vkspec", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("selftest", help="the exact core on the device against the CPU, byte for byte")
    p.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "selftest":
            from .selftest import main as selftest
            return selftest(args.seed)
    except Exception as e:  # one clear line, no traceback
        from .device import DeviceError
        if isinstance(e, DeviceError):
            print(f"vkspec: {e}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
