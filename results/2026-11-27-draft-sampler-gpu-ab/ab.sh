# A/B of DraftSampler on the GPU: old (HEAD) and new (.gpu_new), each run from its own copy
set -u
M="--mixes t1,mixed,greedy --vocab 2048,49152 --repeats 50"
i=0
for side in old new old new old new; do
  i=$((i+1))
  (cd .gpu_$side && python -m benchmarks.vocab_cost_gpu $M --out $OUT/run$i-$side > $OUT/run$i-$side.log 2>&1)
  echo "run$i $side rc=$?"
done
python - <<'PY'
import json, os, glob, shutil
out = os.environ["OUT"]; rows = []
for d in sorted(glob.glob(f"{out}/run*-*/")):
    r = json.load(open(d + "results.json"))
    for c in r["cells"]:
        rows.append({"run": os.path.basename(d.rstrip("/")), **{k: c[k] for k in ("mix", "batch", "k", "vocab", "draft_ms", "verify_ms", "step_ms")}})
    shutil.rmtree(d)
json.dump({"machine": r["machine"], "versions": r["versions"], "rows": rows}, open(f"{out}/ab.json", "w"), indent=1)
PY
grep -h "PASS\|FAIL" $OUT/*.log | sort | uniq -c
