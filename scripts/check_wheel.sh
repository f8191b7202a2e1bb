#!/usr/bin/env bash
# Build the plugin's wheel, install it into a clean venv next to vLLM, and check what
# a production `pip install` gets: the vllm.general_plugins entry point loads and
# registers with vLLM; every shipped preset loads by name; the licence is inside; no
# test-only code (fixture builder, engine-job helpers, the rejection reference, the
# standalone and introspection helpers) is. Prints the wheel's size. Needs .venv
# (scripts/setup.sh) for vLLM itself.
#
# The clean venv reaches vLLM through a .pth line naming .venv's site-packages: sys.path
# gets that folder, but its own .pth files (the editable install of this checkout) are
# not processed, so `import vllm_specdec_plugin` can only find the wheel's copy.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
.venv/bin/pip wheel -q --no-deps --no-build-isolation -w "$tmp/dist" . 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
wheel=$(ls "$tmp"/dist/vllm_specdec_plugin-*.whl)
echo "[wheel] $(basename "$wheel"): $(du -h "$wheel" | cut -f1)"
python_bin=$(readlink -f .venv/bin/python)
"$python_bin" -m venv "$tmp/venv"
site_new=$("$tmp/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
site_dev=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$site_dev" > "$site_new/zz_vllm_from_dev_venv.pth"
"$tmp/venv/bin/python" -m pip install -q --no-deps --disable-pip-version-check "$wheel" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
cd "$tmp"  # not the checkout: nothing may import from the source tree
"$tmp/venv/bin/python" - "$wheel" "$site_new" <<'EOF'
import importlib.metadata as md
import sys
import zipfile
from pathlib import Path

wheel, site_new = sys.argv[1], sys.argv[2]
names = zipfile.ZipFile(wheel).namelist()
modules = sorted({n.split("/")[1] for n in names
                  if n.startswith("vllm_specdec_plugin/") and n.count("/") >= 1})
test_only = [n for n in names if n.startswith(("vllm_specdec_plugin/fixtures/",
                                               "vllm_specdec_plugin/testing/",
                                               "specdec_fixtures/", "specdec_testing/",
                                               "tests/", "benchmarks/"))]
assert not test_only, f"test-only files in the wheel: {test_only[:10]}"
# test-only modules that once lived in the package (now under specdec_testing/)
moved = {f"vllm_specdec_plugin/{m}.py" for m in ("rejection_reference", "compat/introspect",
                                                 "compat/standalone", "compat/step_timers")}
assert not moved & set(names), f"test-only modules in the wheel: {sorted(moved & set(names))}"
assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "no LICENSE in the wheel"
import vllm_specdec_plugin as plugin

assert plugin.__file__.startswith(site_new), f"imported {plugin.__file__}, not the wheel's"
from vllm_specdec_plugin.config import SHIPPED, load_preset, merge_sources

presets = sorted(n.rsplit("/", 1)[1].removesuffix(".yaml") for n in names
                 if n.startswith("vllm_specdec_plugin/configs/") and n.endswith(".yaml"))
assert presets, "no preset in the wheel"
assert SHIPPED.is_relative_to(Path(site_new).resolve()), f"presets read from {SHIPPED}, not the wheel's"
for name in presets:  # by name, as users pass them: "preset": "NAME"
    options = load_preset(name)
    cfg = merge_sources(8, {"preset": name})
    assert cfg.preset == name and all(getattr(cfg, k) == v for k, v in options.items()), name
eps = [ep for ep in md.entry_points(group="vllm.general_plugins") if ep.name == "specdec"]
assert eps, "no vllm.general_plugins entry point 'specdec'"
register = eps[0].load()
register()  # checks the vLLM version and installs the pass-through wrappers
import vllm

print(f"[wheel] entry point {eps[0].value} loads and registers with vLLM {vllm.__version__}; "
      f"presets {presets} load by name; {len(names)} files, a LICENSE, no test-only module")
EOF
