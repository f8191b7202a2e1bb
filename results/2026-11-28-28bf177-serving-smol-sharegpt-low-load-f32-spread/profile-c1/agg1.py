import collections, sys
def agg(path):
    tot=0; incl=collections.Counter(); self_=collections.Counter()
    for line in open(path):
        stack, n = line.rstrip().rsplit(' ',1); n=int(n); tot+=n
        seen=set(); frames=stack.split(';')
        for f in frames:
            k=f.split(' (')[0]+' ('+f.split('/')[-1]
            if k not in seen: incl[k]+=n; seen.add(k)
        f=frames[-1]; self_[f.split(' (')[0]+' ('+f.split('/')[-1]]+=n
    return tot, incl, self_
tot,incl,self_=agg(sys.argv[1])
print('samples',tot)
for k,v in incl.most_common(int(sys.argv[2]) if len(sys.argv)>2 else 50): print(f"{v:6d} {100*v/tot:5.1f}%  {k[:120]}")
