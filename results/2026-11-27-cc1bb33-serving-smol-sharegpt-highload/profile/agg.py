import collections, sys
def agg(path):
    tot=0; incl=collections.Counter()
    for line in open(path):
        stack, n = line.rstrip().rsplit(' ',1); n=int(n); tot+=n
        seen=set()
        for f in stack.split(';'):
            k=f.split(' (')[0]+' ('+f.split('/')[-1]
            if k not in seen: incl[k]+=n; seen.add(k)
    return tot, incl
for role in ("Worker","EngineCore"):
    a=agg(f'prof2-nospec-{role}.txt'); b=agg(f'prof2-plugin-hybrid-adaptive-k8-{role}.txt')
    print(role, 'samples nospec', a[0], 'plugin', b[0])
    keys=set(k for k,v in a[1].most_common(70))|set(k for k,v in b[1].most_common(70))
    rows=sorted(keys, key=lambda k: -max(a[1][k], b[1][k]))
    for k in rows[:45]:
        print(f"  {a[1][k]:5d} {b[1][k]:5d}  {k[:110]}")
