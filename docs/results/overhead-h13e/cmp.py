import csv,sys,glob,collections
for d in sys.argv[1:]:
    rows=list(csv.DictReader(open(d+'/overhead.csv')))
    agg=collections.defaultdict(lambda: collections.Counter())
    for r in rows:
        k=(r['rtt'],r['loss_pct'],r['rate'],r['transport'])
        for f in ['overhead_bytes','frames','ack_only_frames','lost_frames','wire_bytes','lower_bound_overhead']:
            agg[k][f]+=float(r[f])
    print('#',d)
    for k in sorted(agg):
        if k[3]!='quic': continue
        q=agg[k]; t=agg[k[:3]+('tcp',)]
        print(f"{k[0]:5} {k[1]:>2}% {k[2]:>5}: tcp ovh {t['overhead_bytes']:8.0f} fr {t['frames']:5.0f} ack {t['ack_only_frames']:4.0f} | quic ovh {q['overhead_bytes']:8.0f} fr {q['frames']:5.0f} ack {q['ack_only_frames']:4.0f} lost {q['lost_frames']:3.0f} | {100*(q['overhead_bytes']/t['overhead_bytes']-1):+6.1f}%  pk {100*(q['frames']/t['frames']-1):+6.1f}%  lb x{q['overhead_bytes']/q['lower_bound_overhead']:.2f}")
