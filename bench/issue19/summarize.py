import json, re, sys, glob, statistics as st
F = sys.argv[1]
med = lambda v: sorted(v)[len(v)//2]
d = json.load(open(f"{F}/burst.json"))
by = {}
for r in d['runs']:
    s = r['summary']; by.setdefault((s['mode'].split('/')[-1], s['workers']), []).append(s)
print("burst (median over repeats):")
for n in (32, 128, 300):
    nat = by[('native', n)]
    p99n = med([s['p99_ms'] for s in nat]); cpun = med([s['call_cpu_ms_total']/n for s in nat])
    row = [f"{n:4d} native p99 {p99n:.2f} ms cpu/worker {cpun:.3f}"]
    for m in ('libvgpu-before.so', 'libvgpu-after.so'):
        k = [k for k in by if k[0].endswith(m) and k[1] == n][0]
        ss = by[k]; fails = sum(s['failed'] for s in ss)
        row.append(f"{m[7:-3]} {med([s['p99_ms'] for s in ss])/p99n:.3f}x cpu {med([s['call_cpu_ms_total']/n for s in ss]):.3f} failed {fails} reps {len(ss)}")
    print("  " + " | ".join(row))
print("spawn:"); [print("  " + l.strip()) for l in open(f"{F}/spawn-footprint.md") if l.startswith("|") and ("libvgpu" in l or "empty" in l or "bare" in l)]
print("wrapper (added / paired by round / in process where measured; before | after):")
for w in sorted(glob.glob(f"{F}/wrapper-*.md")):
    hdr = None
    for l in open(w):
        if l.startswith("| call"): hdr = [x.strip() for x in l.split("|")[1:-1]]
        elif l.startswith("| cu") and hdr:
            c = dict(zip(hdr, [x.strip() for x in l.split("|")[1:-1]]))
            g = lambda k: c.get(k, "-")
            print(f"  {w[-4:-3]} {g('call')[:30]:30s} direct {g('direct (ns)')} | before {g('baseline added (ns)')} / {g('baseline added, paired (ns)')} / {g('baseline added, in process (ns)')} | after {g('added (ns)')} / {g('added, paired (ns)')} / {g('added, in process (ns)')}")
print("sm overhead (per invocation: within-process limited / unlimited; cross-process):")
allp = {'before': {'l': [], 'u': []}, 'after': {'l': [], 'u': []}}
for j in sorted(glob.glob(f"{F}/sm-*.json")):
    L = j.split('-')[-1][:-5]; o = json.load(open(j))['rows'][0]['overhead']
    for (n, v, dd) in o['paired']: allp[L][n[0]].append(v - dd)
    print(f"  {j.split('/')[-1]:18s} paired +{o['paired_limited_ns']:.0f} / +{o['paired_unlimited_ns']:.0f}; cross +{o['added_limited_ns']:.0f} / +{o['added_unlimited_ns']:.0f}; bare {o['bare_ns']:.0f}")
for L in allp:
    print(f"  pooled {L}: limited median +{med(allp[L]['l']):.0f} ({len(allp[L]['l'])} runs, {min(allp[L]['l']):.0f}..{max(allp[L]['l']):.0f}), unlimited +{med(allp[L]['u']):.0f}")
print("ir:"); print(open(f"{F}/ir.txt").read())
