#!/bin/bash
# pack.sh SRC NAME: copy one run's raw data into bench/results/issue19-runs/NAME
S=$1; D="$(dirname "$0")"/../results/issue19-runs/$2
mkdir -p $D
cp $S/burst.txt $S/spawn-footprint.md $S/sm.txt $S/ir.txt $S/log.txt $D/
for f in $S/wrapper-*.md $S/sm-*.json; do cp $f $D/; done
python3 - $S/burst.json $D/burst-summaries.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
out = {"header": d["header"], "percentile_definition": d["percentile_definition"],
       "runs": [dict(r["summary"], repeat=r["repeat"]) for r in d["runs"]]}
json.dump(out, open(sys.argv[2], "w"), indent=1)
PY
python3 "$(dirname "$0")"/summarize.py $S > $D/summary.txt
