"""``python -m specdec_fixtures [--pair ci|bench|all] [--root DIR] [--force]``"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _say(msg: str) -> None:
    print(msg, flush=True)


def main(argv: list[str] | None = None) -> int:
    from . import BUILDER_VERSION, fixtures_root
    from .build import _ensure
    from .specs import PAIRS, SYNTHETIC_PAIRS

    ap = argparse.ArgumentParser(
        prog="python -m specdec_fixtures",
        description="Build (or find cached) the deterministic fixture model pairs.")
    ap.add_argument("--pair", default="all", choices=[*PAIRS, "all"],
                    help="which pair to build (default: all = the synthetic pairs; smol, the "
                         "real one, only by name: it takes about 20 min)")
    ap.add_argument("--root", type=Path, default=None,
                    help="cache root (default: $SPECDEC_FIXTURES_DIR, else <repo>/.cache/fixtures, "
                         "else ~/.cache/vllm-specdec-plugin/fixtures)")
    ap.add_argument("--force", action="store_true", help="rebuild even if a complete pair exists")
    ap.add_argument("--print-paths", action="store_true",
                    help="build if needed, then print only target=PATH and draft=PATH (one pair)")
    args = ap.parse_args(argv)
    if args.print_paths:
        if args.pair == "all":
            ap.error("--print-paths needs one --pair")
        root = args.root if args.root is not None else fixtures_root()
        pair, _ = _ensure(args.pair, root, args.force, lambda m: print(m, file=sys.stderr, flush=True))
        print(f"target={pair.target}\ndraft={pair.draft}")
        return 0

    names = list(SYNTHETIC_PAIRS) if args.pair == "all" else [args.pair]
    root = args.root if args.root is not None else fixtures_root()
    _say(f"fixtures builder v{BUILDER_VERSION}, root {root}")
    t0 = time.perf_counter()
    pairs = []
    for name in names:
        t = time.perf_counter()
        pair, built = _ensure(name, root, args.force, _say)
        what = "built" if built else "cached"
        eps = f"eps {pair.eps:g}, " if pair.eps is not None else ""
        _say(f"{name}: {what} in {time.perf_counter() - t:.1f}s ({eps}"
             f"agreement {pair.agreement:.3f})")
        pairs.append(pair)
    _say(f"total {time.perf_counter() - t0:.1f}s")
    for pair in pairs:
        _say(f"{pair.name}.target   {pair.target}")
        _say(f"{pair.name}.draft    {pair.draft}")
        _say(f"{pair.name}.manifest {pair.path / 'manifest.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
