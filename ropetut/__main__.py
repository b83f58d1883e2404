"""Command line: ``python -m ropetut check`` and ``python -m ropetut bench``."""
import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ropetut")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="every kernel version against the float64 reference")
    args = parser.parse_args(argv)
    if args.command == "check":
        from .check import main as check_main
        return check_main()
    return 2


if __name__ == "__main__":
    sys.exit(main())
