import collections,sys
for f in sys.argv[1:]:
    lines=open(f).read().splitlines()
    n=len(lines)//(6 if "base" not in f else 3)
    lines=lines[n:]  # drop first step
    d=collections.defaultdict(lambda:[0,0,0])
    for l in lines:
        p=l.split()
        key=(p[2],int(p[3]),int(p[4]),int(p[5]))
        d[key][0]+=float(p[7]); d[key][1]+=float(p[9]); d[key][2]+=1
    T=[0,0,0]; best=0
    print(f)
    for k,(a,b,c) in sorted(d.items(), key=lambda x:-x[1][0]):
        fl=2*k[1]*k[2]*k[3]*c/1e9
        T[0]+=a;T[1]+=b; best+=min(a,b)
        if a>20000: print(f"  {k} x{c:3d} dnnl {fl/(a/1e6):5.0f} GF/s mkl {fl/(b/1e6):5.0f} GF/s  mkl/dnnl speed {a/b:.2f}")
    tsteps=5 if "base" not in f else 2
    print(f"  per step: dnnl {T[0]/1e3/tsteps:.0f} ms, mkl {T[1]/1e3/tsteps:.0f} ms, best-of-both per shape {best/1e3/tsteps:.0f} ms")
