#!/usr/bin/env python3
"""Sums per-kernel GPU time from an ncu --csv --page raw export (gzip).

Usage: ncu --clock-control none --metrics gpu__time_duration.sum --csv \
         --page raw gpt_bench --models=1.3B --warmup=0 --iters=1 > k.csv
       gzip k.csv; bench/ncu_kernel_summary.py k.csv.gz
Prints total kernel time and kernels grouped by name, largest first.
"""
import csv, gzip, sys, re, collections
f = sys.argv[1]
rows = list(csv.reader(gzip.open(f, 'rt')))
hdr_i = next(i for i, r in enumerate(rows) if r and r[0] == 'ID')
hdr = rows[hdr_i]
ki = hdr.index('Kernel Name'); ti = hdr.index('gpu__time_duration.sum'); gi=hdr.index('Grid Size'); bi=hdr.index('Block Size')
units = rows[hdr_i+1][ti]
agg = collections.defaultdict(lambda: [0, 0.0])
total = 0.0
seq=[]
for r in rows[hdr_i+2:]:
    if len(r) <= ti or not r[ti]: continue
    t = float(r[ti].replace(',', ''))
    name = r[ki]
    short = re.sub(r'\(.*', '', name)[:110]
    agg[short][0] += 1; agg[short][1] += t; total += t
    seq.append((short, t, r[gi], r[bi]))
print('units', units, 'total', total, 'kernels', len(seq))
for k, (n, t) in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f'{t/1e6 if units=="ns" else t:10.3f} ms {n:5d}  {k}')
