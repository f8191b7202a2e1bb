"""Deterministic fixture model pairs (Llama target + draft, one shared tokenizer).

Model weights cannot be downloaded on the CI/bench machines, so the builder makes
them locally from the interpreter's standard library (see ``corpus.py``):

* a byte-level BPE tokenizer (vocab 2048) trained on stdlib ``.py`` files;
* a small draft trained briefly with AdamW from a bigram-SVD warm start;
* a target *constructed* from the draft (wider and deeper), equal to the draft's
  function plus an ``eps``-scaled perturbation; ``eps`` is chosen so draft and
  target agree on ~0.7-0.85 of greedy tokens (see ``construct.py``).

Pairs (``specs.py``): ``ci`` (small, float32, for exactness tests) and ``bench``
(bfloat16, a target heavy enough to dominate vLLM's per-step CPU overhead).

Usage::

    from specdec_fixtures import ensure_pair
    pair = ensure_pair("ci")          # builds once, then cached
    pair.target, pair.draft, pair.manifest

or ``python -m specdec_fixtures --pair all``.  Folders live at
``<fixtures_root()>/v<BUILDER_VERSION>/<pair>/{target,draft,manifest.json}``.

Importing this package is cheap: torch, tokenizers and transformers are only
imported when something is built.
"""

from __future__ import annotations

from .build import build_pair, ensure_pair
from .layout import BUILDER_VERSION, FixturePair, fixtures_root, load_pair, pair_dir
from .specs import PAIRS

__all__ = [
    "BUILDER_VERSION",
    "FixturePair",
    "PAIRS",
    "build_pair",
    "ensure_pair",
    "fixtures_root",
    "load_pair",
    "pair_dir",
]
