"""The user documentation stays navigable and current (pure Python; no vLLM).

README.md, CHANGELOG.md and docs/*.md: every relative link resolves (and an anchor
names a heading of its target), every `results/...` path they mention exists, no
sentence refers to an issue number, README stays short and lists every option; the
MkDocs site builds with --strict when mkdocs is installed.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_specdec_plugin.config import SpecDecConfig

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 300

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
ISSUE_REF = re.compile(r"\bissues?\s*#?\s*\d+|\(\s*issues?\b|(?<![\w&/#])#\d+\b", re.I)
RESULTS_PATH = re.compile(r"(?<![\w./-])results/[A-Za-z0-9_.\-/]*")


def _pages() -> list[Path]:
    pages = [README, *sorted(DOCS.glob("*.md"))]
    changelog = ROOT / "CHANGELOG.md"
    if changelog.exists():
        pages.append(changelog)
    return pages


def _prose(text: str) -> str:
    """The text with fenced code blocks and inline code spans blanked out."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)


def _slug(heading: str) -> str:
    """Heading -> anchor, as GitHub and MkDocs' toc both write it for plain headings."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    text = re.sub(r"[^\w\s-]", "", text.strip().lower())
    return re.sub(r"[-\s]+", "-", text).strip("-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {_slug(h) for h in HEADING.findall(text)}


def _links(page: Path) -> list[str]:
    return LINK.findall(_prose(page.read_text(encoding="utf-8")))


def _is_external(target: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) is not None


def test_docs_pages_exist():
    assert DOCS.is_dir(), "docs/ is missing"
    for name in ("index", "design", "exactness", "benchmarks", "serving-and-tuning",
                 "observability", "ray", "multi-tenant", "testing"):
        assert (DOCS / f"{name}.md").is_file(), f"docs/{name}.md is missing"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken = []
    for target in _links(page):
        if _is_external(target):
            continue
        path_part, _, anchor = target.partition("#")
        dest = page if not path_part else (page.parent / path_part).resolve()
        if not dest.exists():
            broken.append(f"{target}: {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} does not exist")
            continue
        if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not broken, f"{page.name}: broken links:\n" + "\n".join(broken)


def test_docs_links_stay_inside_docs():
    """MkDocs can serve only files under docs/: repository files are named as code."""
    outside = []
    for page in sorted(DOCS.glob("*.md")):
        for target in _links(page):
            path_part = target.partition("#")[0]
            if path_part and not _is_external(target):
                dest = (page.parent / path_part).resolve()
                if not dest.is_relative_to(DOCS.resolve()):
                    outside.append(f"{page.name}: {target}")
    assert not outside, "links from docs/ to files outside it (write them as `code`):\n" + "\n".join(outside)


def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; keep it at most {README_MAX_LINES} (move detail to docs/)"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_numbers(page: Path):
    hits = []
    for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        m = ISSUE_REF.search(line)
        if m:
            hits.append(f"{page.name}:{i}: {m.group(0)!r} in {line.strip()!r}")
    assert not hits, "user documentation states the current truth, not the issue log:\n" + "\n".join(hits)


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_results_exist(page: Path):
    missing = []
    for raw in RESULTS_PATH.findall(page.read_text(encoding="utf-8")):
        path = raw.rstrip(".,;:")
        if not (ROOT / path).exists():
            missing.append(path)
    assert not missing, f"{page.name} cites results that are not in the repository: {missing}"


def option_table(page: Path) -> dict[str, str]:
    """The page's option table: ``| `name` | default | meaning |`` rows under a header
    ``| option | default | meaning |``, as {name: default}."""
    rows, inside = {}, False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("| option | default |"):
            inside = True
        elif inside and not line.startswith("|"):
            break
        elif inside and line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0].strip("`")] = cells[1].strip("`")
    return rows


def _doc_default(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@pytest.mark.parametrize("page", [README, DOCS / "serving-and-tuning.md"], ids=lambda p: p.name)
def test_option_tables_match_config(page: Path):
    """Each page's option table has exactly config.py's options, with their defaults
    (k is vLLM's own key: its default is vLLM's)."""
    table = option_table(page)
    fields = {f.name: f.default for f in dataclasses.fields(SpecDecConfig)}
    assert set(table) == set(fields), (f"{page.name}: options missing from the table "
                                       f"{sorted(set(fields) - set(table))}, not options "
                                       f"{sorted(set(table) - set(fields))}")
    wrong = {name: (table[name], _doc_default(d)) for name, d in fields.items()
             if name != "num_speculative_tokens" and table[name] != _doc_default(d)}
    assert not wrong, f"{page.name}: documented default != config.py's: {wrong}"


def test_mkdocs_strict_build(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (it is in the `test` extra)")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()


def test_the_results_page_is_generated_from_the_runs():
    """docs/results.md is what ``benchmarks.results_page`` makes of results/*/serving.json
    (every serving figure the docs quote is a cell of it)."""
    from benchmarks import results_page

    assert results_page.main(["--check"]) == 0, "run `python -m benchmarks.results_page`"
