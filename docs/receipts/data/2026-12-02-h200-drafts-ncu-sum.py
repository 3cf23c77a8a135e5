import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
head = None
for i, r in enumerate(rows):
    if "Kernel Name" in r:
        head = i; break
h = rows[head]; k = h.index("Kernel Name"); m = h.index("gpu__time_duration.sum")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows[head + 2:]:
    if len(r) <= m: continue
    name = r[k].split("(")[0].split("[")[0]
    try: v = float(r[m].replace(",", ""))
    except ValueError: continue
    tot[name] += v; cnt[name] += 1
s = sum(tot.values())
print(f"all: {sum(cnt.values())} kernels, {s/1000:.1f} us*1000 (units as ncu reports)")
for n, v in sorted(tot.items(), key=lambda e: -e[1]):
    print(f"{n[:60]:60s} {cnt[n]:5d} {v:12.1f} {100*v/s:5.1f}%")
