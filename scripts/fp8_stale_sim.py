"""FP8 softmax schemes, tile by tile, in fp64 (CPU, NumPy + ml_dtypes): FlashAttention-3's outlier
data, N = 4096, d = 128, every 4th query row, Q and K rotated and block-scaled (E4M3, or INT8
with "int8"), V block-scaled E4M3, P in E4M3 lifted by 2^lift, keys in 128-key tiles visited
from the last, as the kernel does. RMSE of O against fp64 for
  orig : a fresh running max every tile, V's descale applied to O (the kernel before run 53);
  stale: the kernel since run 53 (OnlineSoftmax): a reference R that moves only when the row
         max grows by more than tau, V's log2 descale in P's exponent, row sums divided by it;
and the lift / margin pairs that WARPATTN_TUNE_FP8_P_LIFT gives (lift + tau = 8.75).
(The rows here are every 4th, so a "warp" of 16 simulated rows spans 64 real ones: the
rescale share is an upper bound.)
Usage: pip install numpy ml_dtypes; python3 scripts/fp8_stale_sim.py [seed [int8]]"""
import numpy as np, ml_dtypes, sys
seed=int(sys.argv[1]) if len(sys.argv)>1 else 1
rng=np.random.default_rng(seed)
N,D,BN=4096,128,128
E=ml_dtypes.float8_e4m3fn; bf=ml_dtypes.bfloat16
def e4(x): return np.clip(x,-448,448).astype(E).astype(np.float64)
def data():
    x=rng.standard_normal((N,D)); m=rng.random((N,D))<0.001; x[m]+=10*rng.standard_normal(m.sum())
    return x.astype(bf).astype(np.float64)
q,k,v=data(),data(),data()
rows=np.arange(0,N,4)
st=q[rows]@k.T/np.sqrt(D); st-=st.max(1,keepdims=True); pt=np.exp(st); R=(pt@v)/pt.sum(1,keepdims=True)
H=np.array([[1.0]])
while H.shape[0]<D: H=np.block([[H,H],[H,-H]])
H/=np.sqrt(D); signs=np.where(rng.random(D)<0.5,-1.0,1.0)
INT8=len(sys.argv)>2 and sys.argv[2]=="int8"
def quant(x,rot,int8=False):
    if rot: x=(x*signs)@H.T
    codes=np.empty_like(x); ds=[]
    for b0 in range(0,N,128):
        if int8:
            d=np.abs(x[b0:b0+128]).max()/127; codes[b0:b0+128]=np.clip(np.rint(x[b0:b0+128]/d),-127,127); ds.append(d); continue
        d=np.abs(x[b0:b0+128]).max()/448
        codes[b0:b0+128]=e4(x[b0:b0+128]/d); ds.append(d)
    return codes,np.array(ds)
Qc,qd=quant(q,True,int8=INT8); Kc,kd=quant(k,True,int8=INT8)
Sraw=(Qc[rows]@Kc.T)*np.repeat(qd,128)[rows][:,None]/np.sqrt(D)*np.log2(np.e)
Sraw*=np.repeat(kd,128)[None,:]
def run(tau,mode,lift=8):
    Vc,vd=quant(v,False)
    nt=N//BN; n=len(rows)
    Rr=np.full(n,-np.inf); l=np.zeros(n); O=np.zeros((n,D)); warp_moves=[]
    for j in reversed(range(nt)):
        s=Sraw[:,j*BN:(j+1)*BN]; V=Vc[j*BN:(j+1)*BN]; lv=np.log2(vd[j])
        if mode=="orig":
            t=s.max(1); new=np.maximum(Rr,t)
            a=np.where(np.isinf(Rr),0,np.exp2(Rr-new)); Rr=new
            p=np.exp2(s-Rr[:,None]+lift); p8=e4(p)
            l=l*a+p.sum(1); O=O*a[:,None]+ (p8@V)*vd[j]
        else:
            t=s.max(1)+lv; mv=t>Rr+tau; new=np.where(mv,t,Rr)
            if j<nt-1: warp_moves.append(mv[:n//16*16].reshape(-1,16).any(1).mean())  # 16 rows: one warp
            a=np.where(np.isinf(Rr),0,np.exp2(Rr-new)); Rr=new
            p=np.exp2(s+lv-Rr[:,None]+lift); p8=e4(p)
            l=l*a+p.sum(1)/vd[j]; O=O*a[:,None]+p8@V
    o=O/l[:,None]
    return np.sqrt(((o-R)**2).mean()), (np.mean(warp_moves) if warp_moves else 1.0)
print("seed",seed,"int8" if INT8 else "e4m3")
for mode,tau,lift in (("orig",0,8),("stale",0.75,8),("stale",1.75,7),("stale",2.75,6),("stale",3.75,5)):
    rmse,moves=run(tau,mode,lift)
    print(f"{mode:5s} lift={lift} tau={tau:<5}: RMSE {rmse:.4e}, warps rescaling O in {100*moves:.0f}% of key tiles")
