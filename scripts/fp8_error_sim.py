"""FP8 attention error budget in fp64 (CPU, NumPy + ml_dtypes): FlashAttention-3's outlier data,
N = 4096, d = 128, one head, every row. Splits the RMSE of O into what Q/K, V and P rounding
contribute, what V in BF16, a two-term Q or INT8 Q/K would buy, and what a ~14-bit tensor-core
accumulation of P·V costs (docs/perf/fp8-accuracy.md).
Usage: pip install numpy ml_dtypes; python3 scripts/fp8_error_sim.py [seed [N D [rows]]]
(rows: how many query rows the RMSE covers, default every row)"""
import numpy as np, ml_dtypes, sys
rng=np.random.default_rng(int(sys.argv[1]) if len(sys.argv)>1 else 0)
N,D=(int(sys.argv[2]),int(sys.argv[3])) if len(sys.argv)>3 else (4096,128)
E=ml_dtypes.float8_e4m3fn
bf=ml_dtypes.bfloat16
def e4(x): return np.clip(x,-448,448).astype(E).astype(np.float64)
def data():
    x=rng.standard_normal((N,D)); m=rng.random((N,D))<0.001; x[m]+=10*rng.standard_normal(m.sum())
    return x.astype(bf).astype(np.float64)
q,k,v=data(),data(),data()
rows=np.arange(int(sys.argv[4]) if len(sys.argv)>4 else N)
def ref():
    s=q[rows]@k.T/np.sqrt(D); s-=s.max(1,keepdims=True); p=np.exp(s); return (p@v)/p.sum(1,keepdims=True)
R=ref()
H=np.array([[1.0]])
while H.shape[0]<D: H=np.block([[H,H],[H,-H]])
H/=np.sqrt(D)
signs=np.where(rng.random(D)<0.5,-1.0,1.0)
def quant(x,block,rot):
    if rot: x=(x*signs)@H.T
    out=np.empty_like(x); sc=np.empty(N)
    for b0 in range(0,N,block):
        a=np.abs(x[b0:b0+block]).max(); d=a/448
        out[b0:b0+block]=e4(x[b0:b0+block]/d)*d
    return out
def fp8_attn(block,rot,l_from_quant, pquant=True):
    qq,kk,vv=quant(q,block,rot),quant(k,block,rot),quant(v,block,False)
    s=(qq[rows]@kk.T/np.sqrt(D))*np.log2(np.e)
    m=s.max(1,keepdims=True); p=np.exp2(s-m+8)
    p8=e4(p) if pquant else p
    l=(p8 if l_from_quant else p).sum(1,keepdims=True)
    return (p8@vv)/l
for name,block,rot in [("tensor",N,False),("block",128,False),("block+H",128,True)]:
    for lq in (False,True):
        o=fp8_attn(block,rot,lq)
        print(f"{name:8s} l_from_quantP={lq}: RMSE {np.sqrt(((o-R)**2).mean()):.3e}")
o=fp8_attn(128,True,False,pquant=False); print("block+H, P unquantized:", np.sqrt(((o-R)**2).mean()))
def attn_custom(qq,kk,vv,pq=True):
    s=(qq[rows]@kk.T/np.sqrt(D))*np.log2(np.e); m=s.max(1,keepdims=True); p=np.exp2(s-m+8)
    p8=e4(p) if pq else p
    return (p8@vv)/p.sum(1,keepdims=True)
def rm(o): return np.sqrt(((o-R)**2).mean())
Q,K,V=quant(q,128,True),quant(k,128,True),quant(v,128,False)
qr=(q*signs)@H.T; kr=(k*signs)@H.T
print("only V quantized:", rm(attn_custom(qr,kr,V,False)))
print("only QK quantized:", rm(attn_custom(Q,K,v,False)))
# per-row Q scale, per-block K
def quant_rows(x,rot):
    if rot: x=(x*signs)@H.T
    d=np.abs(x).max(1,keepdims=True)/448; return e4(x/d)*d
def quant_vcols(x,block):
    out=np.empty_like(x)
    for b0 in range(0,N,block):
        d=np.abs(x[b0:b0+block]).max(0,keepdims=True)/448; out[b0:b0+block]=e4(x[b0:b0+block]/d)*d
    return out
print("Q per row + K block + V block:", rm(attn_custom(quant_rows(q,True),K,V)))
print("Q block + K block + V per-column block:", rm(attn_custom(Q,K,quant_vcols(v,128))))
print("Q row + K block + V col:", rm(attn_custom(quant_rows(q,True),K,quant_vcols(v,128))))
print("Q row + K row + V col:", rm(attn_custom(quant_rows(q,True),quant_rows(k,True),quant_vcols(v,128))))
print("ref rms", np.sqrt((R**2).mean()))
# What costlier variants would buy: V kept in BF16; Q (and K) as two E4M3 terms.
def two_term(x):
    hi = quant(x, 128, True)
    return hi + quant((x * signs) @ H.T - hi, 128, False)  # the rotated value's residual
print("QK fp8 rotated, V bf16:", rm(attn_custom(Q, K, v)))
print("two-term Q; K, V fp8:", rm(attn_custom(two_term(q), K, V)))
print("two-term Q and K; V fp8:", rm(attn_custom(two_term(q), two_term(k), V)))
# INT8 Q and K after the rotation (Hopper's s8 wgmma runs at the FP8 rate): symmetric per block,
# scale = amax / 127; the scores are exact integers times the two scales. P and V stay E4M3.
def int8_block(x, block, rot):
    if rot: x = (x * signs) @ H.T
    out = np.empty_like(x)
    for b0 in range(0, N, block):
        d = np.abs(x[b0:b0 + block]).max() / 127
        out[b0:b0 + block] = np.clip(np.rint(x[b0:b0 + block] / d), -127, 127) * d
    return out
print("INT8 Q, K per block + H; V, P E4M3:", rm(attn_custom(int8_block(q, 128, True), int8_block(k, 128, True), V)))
print("INT8 Q, K per block, no H; V, P E4M3:", rm(attn_custom(int8_block(q, 128, False), int8_block(k, 128, False), V)))
print("INT8 Q, K per block + H; V E4M3, P exact:", rm(attn_custom(int8_block(q, 128, True), int8_block(k, 128, True), V, False)))
# QGMMA's accumulator keeps ~14 bits when it adds each k32 step (DeepSeek-V3 report): O after
# P·V accumulated over k32 steps of keys, truncated toward zero to `bits` mantissa bits each time.
def trunc(x, bits):
    m, e = np.frexp(x)
    return np.ldexp(np.trunc(m * 2.0**bits) / 2.0**bits, e)
s=(Q[rows]@K.T/np.sqrt(D))*np.log2(np.e); p=np.exp2(s-s.max(1,keepdims=True)+8); p8=e4(p)
for bits in (23, 14, 13, 12):
    acc=np.zeros((len(rows),D))
    for c0 in range(0,N,32): acc=trunc(acc+p8[:,c0:c0+32]@V[c0:c0+32], bits)
    print("block+H, P·V accumulated to %d bits per k32 step: RMSE %.3e" % (bits, rm(acc/p.sum(1,keepdims=True))))
