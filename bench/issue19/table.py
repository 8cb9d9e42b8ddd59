"""One row per packed run of bench/results/issue19-runs: the §1 figures."""
import glob, json, os, re, sys
R = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../results/issue19-runs")
med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")
def num(x):
    try: return float(x.replace("+", ""))
    except Exception: return float("nan")
rows = []
for d in sorted(glob.glob(f"{R}/run-*")):
    name = d.split("-")[-1]
    start = open(f"{d}/log.txt").readline().split()[1]
    b = json.load(open(f"{d}/burst-summaries.json"))["runs"]
    by = {}
    for s in b: by.setdefault((s["mode"].split("/")[-1], s["workers"]), []).append(s)
    burst, cpu = [], []
    for n in (32, 128, 300):
        nat = by[("native", n)]; aft = [v for k, v in by.items() if k[0].endswith("after.so") and k[1] == n][0]
        burst.append(med([s["p99_ms"] for s in aft]) / med([s["p99_ms"] for s in nat]))
        cpu.append(med([s["call_cpu_ms_total"] / n for s in aft]) - med([s["call_cpu_ms_total"] / n for s in nat]))
    sp = {}
    for l in open(f"{d}/spawn-footprint.md"):
        c = [x.strip() for x in l.split("|")[1:-1]]
        if c and (c[0].startswith("libvgpu.so") or c[0].startswith("empty")):
            paired = c[6] if len(c) > 10 else "-"
            sp[c[0][:5]] = (c[5], paired, c[6 + (len(c) > 10)])
    af, ul = {"x": [], "p": [], "i": []}, []
    bf = {"x": [], "i": []}
    for w in sorted(glob.glob(f"{d}/wrapper-*.md")):
        hdr = None
        for l in open(w):
            if l.startswith("| call"): hdr = [x.strip() for x in l.split("|")[1:-1]]
            elif l.startswith("| cuMemAlloc") or l.startswith("| cuLaunchKernel (no SM limit; batches"):
                c = dict(zip(hdr, [x.strip() for x in l.split("|")[1:-1]]))
                if l.startswith("| cuMemAlloc"):
                    af["x"].append(num(c["added (ns)"])); af["p"].append(num(c["added, paired (ns)"]))
                    af["i"].append(num(c.get("added, in process (ns)", "nan")))
                    bf["x"].append(num(c["baseline added (ns)"])); bf["i"].append(num(c.get("baseline added, in process (ns)", "nan")))
                else:
                    ul.append(num(c.get("added, in process (ns)", c["added (ns)"])))
    lim = {"before": [], "after": []}
    direct = []
    for j in glob.glob(f"{d}/sm-*.json"):
        L = j.split("-")[-1][:-5]; o = json.load(open(j))["rows"][0]["overhead"]
        for (cfg, v, dd) in o["paired"]:
            if cfg == "limited": lim[L].append(v - dd); direct.append(dd)
    ir = {}
    for l in open(f"{d}/ir.txt"):
        m = re.match(r"(\S+) (\w+) sm=(\w+): (\d+)", l)
        if m: ir[(m.group(1).split("-")[-1] if "-" in m.group(1) else m.group(1), m.group(2), m.group(3))] = int(m.group(4))
    lim_ir = lambda who: ir.get((who, "launch", "50"), 0) - ir.get(("none", "launch", "none"), 0)
    alloc_ir = lambda who: ir.get((who, "alloc", "none"), 0) - ir.get(("none", "alloc", "none"), 0)
    f = lambda v: f"{v:+.0f}" if v == v else "—"
    rows.append(f"| {name} | {start} | {med(direct):.0f} | " + " / ".join(f"{x:.3f}" for x in burst)
                + f" | {max(cpu):+.3f} | {sp['libvg'][0]} / {sp['libvg'][1]} ({sp['empty'][0]} / {sp['empty'][1]}), {sp['libvg'][2]} µs"
                + f" | {f(med(af['x']))} / {f(med(af['p']))} / {f(med(af['i']))} (before {f(med(bf['x']))} / {f(med(bf['i']))})"
                + f" | {f(med(ul))} | {f(med(lim['after']))} (before {f(med(lim['before']))}; {len(lim['after'])} runs)"
                + f" | {alloc_ir('after')} / {lim_ir('after')} (before {alloc_ir('before')} / {lim_ir('before')}) |")
print("| run | start (UTC) | bare launch in the SM runs, median ns | burst p99 / native, 32 / 128 / 300 | CPU in `cuInit` over native, worst, ms | spawn CPU ratio / paired (empty .so), µs/process | alloc + free added: columns / paired by round / in process | unlimited launch added | limited launch added, in process, pooled median | Ir added: alloc + free / limited launch |")
print("| --- | --- | ---: | --- | ---: | --- | --- | ---: | --- | --- |")
print("\n".join(rows))
