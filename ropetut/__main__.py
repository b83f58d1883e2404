"""Command line: ``python -m ropetut`` check, bench, bench-qk-norm, bench-angles and
train."""

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ropetut")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="every kernel version against the float64 reference")
    # bench parses its own options (python -m ropetut bench -h lists them)
    sub.add_parser(
        "bench", add_help=False, help="time versions and peers against the copy floor"
    )
    sub.add_parser(
        "bench-qk-norm",
        add_help=False,
        help="fused QK-norm + RoPE against its unfused peers (issue 18)",
    )
    sub.add_parser(
        "bench-angles",
        add_help=False,
        help="table-free RoPE against the table kernel (issue 26)",
    )
    sub.add_parser(
        "train", add_help=False, help="train the tiny GPT: one configuration or a study"
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        from .bench import main as bench_main

        return bench_main(rest)
    if args.command == "bench-qk-norm":
        from .bench.qk_norm import main as bench_qk_norm_main

        return bench_qk_norm_main(rest)
    if args.command == "bench-angles":
        from .bench.angles import main as bench_angles_main

        return bench_angles_main(rest)
    if args.command == "train":
        from .training.train import main as train_main

        return train_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    from .check import main as check_main

    return check_main()


if __name__ == "__main__":
    sys.exit(main())
