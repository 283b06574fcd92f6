"""`fracspawner check CATALOG`: every mistake of a catalog at once, for admins and CI.

Each problem on its own line with its path (`pools.h100.offers[3]: ...`) and a did-you-mean
for a typo; exit 0 when the catalog is clean, 1 when it has problems, 2 on bad usage. A clean
catalog's settings that cannot help (hibernation or idle-kernel shut-downs on a pool where the
GPU memory they free is usable by no one else) are warned of, with exit 0. The backends the
pools name check their offers too, as at hub start-up.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..backends import backend_names, check_pool
from ..model.catalog import load_yaml
from ..model.check import catalog_warnings, file_problems, report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="fracspawner check",
        description="Check a catalog file: every mistake at once, each with its path.",
    )
    parser.add_argument("catalog", help="the catalog YAML file")
    args = parser.parse_args(argv)
    if Path(args.catalog).is_dir():
        print(
            f"fracspawner check: {args.catalog} is a directory; give the catalog file "
            "(a YAML file)",
            file=sys.stderr,
        )
        return 2
    if not Path(args.catalog).is_file():  # not "1 problem in the catalog": there is none
        print(f"fracspawner check: no such file: {args.catalog}", file=sys.stderr)
        return 2
    problems = file_problems(args.catalog, check_pool, backend_names())
    # settings that cannot help (freeing GPU memory that is no one else's): exit 0
    warnings = [] if problems else catalog_warnings(load_yaml(Path(args.catalog)), check_pool)
    print(report(args.catalog, problems, warnings), file=sys.stderr if problems else sys.stdout)
    return 1 if problems else 0
