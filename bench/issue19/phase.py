"""phase.py FILE: does a process's added cost follow its driver's own cost?
Splits the processes of phase.sh's output at the median direct launch cost
and prints each half's medians, then Spearman's rank correlation of direct
against added, per call."""
import statistics as st
import sys

rows = [list(map(float, l.split()[1:])) for l in open(sys.argv[1]) if len(l.split()) == 7]
def rank(v):
    o = sorted(range(len(v)), key=lambda i: v[i]); r = [0.0] * len(v)
    for k, i in enumerate(o): r[i] = k
    return r
def spearman(a, b):
    ra, rb = rank(a), rank(b); n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))
names = ["limited launch", "alloc + free", "cuMemGetInfo"]
cut = st.median(r[0] for r in rows)
print(f"{len(rows)} processes; split at the median direct launch, {cut:.0f} ns")
print("| call | fast half: direct / added (ns) | slow half: direct / added (ns) | Spearman direct vs added |")
print("| --- | ---: | ---: | ---: |")
for j, name in enumerate(names):
    d = [r[2 * j] for r in rows]; a = [r[2 * j + 1] - r[2 * j] for r in rows]
    fast = [(x, y) for x, y, r in zip(d, a, rows) if r[0] <= cut]
    slow = [(x, y) for x, y, r in zip(d, a, rows) if r[0] > cut]
    f = lambda h: f"{st.median(x for x, _ in h):.0f} / {st.median(y for _, y in h):+.0f}"
    print(f"| {name} | {f(fast)} | {f(slow)} | {spearman(d, a):.2f} |")
