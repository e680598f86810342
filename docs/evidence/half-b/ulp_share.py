# Share of a BF16 checkpoint's elements that a move of 3e-5 would carry across a BF16
# rounding boundary, from each element's ulp (docs/model-families.md, 0.5B, delta).
# .cache/venv/bin/python docs/evidence/half-b/ulp_share.py A.gguf B.gguf
import struct, sys, numpy as np
def rd(f, fmt): return struct.unpack('<'+fmt, f.read(struct.calcsize('<'+fmt)))
def rstr(f): (n,)=rd(f,'Q'); return f.read(n).decode('utf8','replace')
SZ={0:'B',1:'b',2:'H',3:'h',4:'I',5:'i',6:'f',7:'?',10:'Q',11:'q',12:'d'}
def rval(f,t):
    if t==8: return rstr(f)
    if t==9:
        (at,n)=rd(f,'IQ')
        if at==8: [rstr(f) for _ in range(n)]; return None
        f.read(n*struct.calcsize(SZ[at])); return None
    return rd(f,SZ[t])[0]
def expected_change(path, lr=3e-5):
    f=open(path,'rb'); assert f.read(4)==b'GGUF'; (v,nt,nkv)=rd(f,'IQQ')
    align=32
    for _ in range(nkv):
        k=rstr(f); (t,)=rd(f,'I'); val=rval(f,t)
        if k=='general.alignment': align=val
    infos=[]
    for _ in range(nt):
        name=rstr(f); (nd,)=rd(f,'I'); dims=rd(f,'Q'*nd); (ty,off)=rd(f,'IQ'); infos.append((name,dims,ty,off))
    base=(f.tell()+align-1)//align*align
    tot=0; exp=0.0
    for name,dims,ty,off in infos:
        if ty!=30: continue  # BF16
        n=int(np.prod(dims)); f.seek(base+off); b=np.frombuffer(f.read(2*n),dtype=np.uint16)
        e=((b>>7)&0xff).astype(np.int32)   # biased exponent
        ulp=np.ldexp(1.0, e-127-7)
        p=np.minimum(1.0, lr/ulp)         # chance a move of lr crosses a rounding boundary
        tot+=n; exp+=p.sum()
    return tot, exp/tot
for p in sys.argv[1:]:
    n,frac=expected_change(p); print(f"{p}: {n} BF16 elements, expected share changed by a move of 3e-5: {100*frac:.1f} %")
