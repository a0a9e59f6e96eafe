import csv,sys,collections
def q(v,p): v=sorted(v); return v[min(len(v)-1,int(p*len(v)))]
for d in sys.argv[1:]:
    g=collections.defaultdict(list)
    for r in csv.DictReader(open(d+'/hol.csv')):
        g[(r['bench'],r['loss_percent'],r['transport'])].append(float(r['sample_ms']))
    print('#',d)
    for k,v in sorted(g.items()):
        if 'default' in k[2] or k[2]=='tcp':
            print(f"  {k[0][:10]:10} {k[1]:>3}% {k[2][:22]:22} n {len(v):4} p50 {q(v,.5):7.2f} p99 {q(v,.99):7.2f}")
