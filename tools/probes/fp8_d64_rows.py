# FP8 d=64 diagnosis (session 3, run 33): which operand of the S GEMM reads wrong data, by
# zeroing one of Q and K. Result then: Q=0 with random K gave non-uniform P on odd rows; the
# cause was the Q/K tensor map's swizzle (LOG.md runs 36-38). With the fix every case is
# uniform where it should be.
import torch, warpattn
def run(q,k,v):
    ops=warpattn.quantize_fp8(q,k,v,rotate=False)
    out=warpattn.flash_attn_fp8_func(ops); torch.cuda.synchronize(); return out.float(), ops
d=64; S=128
z=lambda: torch.zeros(1,S,1,d,device='cuda',dtype=torch.bfloat16)
r=lambda: torch.randn(1,S,1,d,device='cuda',dtype=torch.bfloat16)
v=z(); v[0,:,0,:]=(torch.arange(S,device='cuda').float()/S)[:,None]
for name,(q,k) in {'Q rand, K 0':(r(),z()), 'Q 0, K rand':(z(),r()), 'Q rand, K rand':(r(),r()), 'Q=1,K=1':(z()+1,z()+1), 'Q=onehot col0, K rand':(None,None)}.items():
    if q is None:
        q=z(); q[...,0]=1; k=r()
    o,ops=run(q,k,v)
    print(name, 'nan', int(o.isnan().sum()), 'O[0,:4,0,0]', o[0,:4,0,0].tolist(), 'descales q,k', ops.q_descale.flatten()[:2].tolist(), ops.k_descale.flatten()[:2].tolist())
