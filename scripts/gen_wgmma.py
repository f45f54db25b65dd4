#!/usr/bin/env python3
"""Writes src/hopper/ptx/wgmma_ops.cuh: one inline-PTX wrapper per wgmma shape the kernels use.

An asm statement must name every accumulator register, so each N needs its own operand list;
generating them keeps the header mechanical and the kernels free of raw asm.
  SS (A and B from shared-memory descriptors): the S = Q·Kᵀ GEMM, N = kBlockN (N = 16 and 32: a
  KV cache's few-row tile's Sᵀ = K·Qᵀ, decode/few_rows_tile.cuh; N = 40: the
  backward's S = Q·Kᵀ and dP = dO·Vᵀ at d = 256, each consumer 40 of the 80 keys; N = 32: its
  Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ at d = 512, 32-query blocks).
  RS (A from registers, B from a descriptor):  the O += P·V GEMM, N = head dim.
  SS, both transposed (A and B MN-major: tnspA = tnspB = 1): the backward's dQ = dS·K, dS
  stored [key][query] and K [key][d], both read along their contiguous axis as M and N.
  SS, A transposed (A MN-major, B K-major: tnspA = 1, tnspB = 0): the backward's transposed dQ
  at 80-row query blocks (d = 128) and 32-row ones (d = 512), dQᵀ = Kᵀ·dSᵀ (and the few-row
  tile's Oᵀ = Vᵀ·Pᵀ, N = 16 and 32), K [key][d] read as Kᵀ (d on M), dS stored [query][key]
  (queries on N, keys contiguous: K-major).
  FP8 (e4m3, k32): both operands K-major (no transpose immediates exist for FP8); the P·V
  GEMM reads Vᵀ, so its B is K-major too.
  INT8 (s8, k32, SS only): the S GEMM of the INT8-Q/K variant. Its accumulators are s32, which
  PTX only accepts in integer registers: the kernel's float array is passed as its bits, and
  holds integers until the softmax converts them.
Run: python3 scripts/gen_wgmma.py  (rewrites the header in place).
"""
import pathlib

SS_N = [16, 32, 40, 64, 80, 96, 112, 128, 144, 160, 176, 192]
RS_N = [64, 128, 256]
SS_TRANSPOSED_N = [64]
TYPES = [("__nv_bfloat16", "bf16"), ("__half", "f16")]
FP8_SS_N = [16, 32, 128]  # 16, 32: an E4M3 cache's few-row Sᵀ = K·Qᵀ and Oᵀ = Vᵀ·Pᵀ (probe first)
S8_SS_N = [128]
FP8_RS_N = [64, 128, 256]
SS_TRANSPOSED_A_N = [16, 32, 80]


def regs(n):
    return ", ".join(f"%{i}" for i in range(n))


def acc_operands(nd):
    return ", ".join(f'"+f"(d[{i}])' for i in range(nd))


def int_acc_operands(nd):  # s32 accumulators: the float registers' bits
    return ", ".join(f'"+r"(reinterpret_cast<uint32_t&>(d[{i}]))' for i in range(nd))


def wrapper(kind, ctype, n, k, types, comment, immediates, operands=acc_operands):
    """One specialisation of WgmmaSS (A from a descriptor) or WgmmaRS (A in four registers).

    types: the PTX type suffix (d.a.b); comment: the shape line after "D(64x{n}, "; immediates:
    what follows the scale-d predicate in the instruction.
    """
    nd = n // 2
    if kind.startswith("SS"):
        signature = "uint64_t desc_a, uint64_t desc_b,\n                                             int accumulate"
        a_operand, inputs = f"%{nd}, %{nd + 1}", '"l"(desc_a), "l"(desc_b), "r"(accumulate)'
        pred = nd + 2
    else:
        signature = "const uint32_t (&a)[4],\n                                             uint64_t desc_b, int accumulate"
        a_operand = f"{{%{nd}, %{nd + 1}, %{nd + 2}, %{nd + 3}}}, %{nd + 4}"
        inputs = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)'
        pred = nd + 5
    return f"""template <>
struct Wgmma{kind}<{ctype}, {n}> {{
  // D(64x{n}, {comment}
  __device__ __forceinline__ static void mma(float (&d)[{nd}], {signature}) {{
    asm volatile(
        "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{pred}, 0;\\n"
        "wgmma.mma_async.sync.aligned.m64n{n}k{k}.{types} "
        "{{{regs(nd)}}}, {a_operand}, p{immediates};\\n}}\\n"
        : {operands(nd)}
        : {inputs});
  }}
}};
"""


def ss(ctype, ptx, n):
    return wrapper("SS", ctype, n, 16, f"f32.{ptx}.{ptx}",
                   f"f32) {{=, +=}} A(64x16, smem, K-major) * B(16x{n}, smem, K-major)", ", 1, 1, 0, 0")


def rs(ctype, ptx, n):
    return wrapper("RS", ctype, n, 16, f"f32.{ptx}.{ptx}",
                   f"f32) {{=, +=}} A(64x16, registers) * B(16x{n}, smem, MN-major: tnspB = 1)", ", 1, 1, 1")


def ss_transposed(ctype, ptx, n):
    return wrapper("SSTransposed", ctype, n, 16, f"f32.{ptx}.{ptx}",
                   f"f32) {{=, +=}} A(64x16, smem, MN-major: tnspA = 1) * B(16x{n}, smem, MN-major: tnspB = 1)",
                   ", 1, 1, 1, 1")


def ss_transposed_a(ctype, ptx, n):
    return wrapper("SSTransposedA", ctype, n, 16, f"f32.{ptx}.{ptx}",
                   f"f32) {{=, +=}} A(64x16, smem, MN-major: tnspA = 1) * B(16x{n}, smem, K-major)",
                   ", 1, 1, 1, 0")


def ss_fp8(n):
    return wrapper("SS", "__nv_fp8_e4m3", n, 32, "f32.e4m3.e4m3",
                   f"f32) {{=, +=}} A(64x32, smem, K-major) * B(32x{n}, smem, K-major), e4m3", ", 1, 1")


def rs_fp8(n):
    return wrapper("RS", "__nv_fp8_e4m3", n, 32, "f32.e4m3.e4m3",
                   f"f32) {{=, +=}} A(64x32, registers) * B(32x{n}, smem, K-major), e4m3", ", 1, 1")


def ss_s8(n):
    return wrapper("SS", "int8_t", n, 32, "s32.s8.s8",
                   f"s32 bits in float registers) {{=, +=}} A(64x32, smem, K-major) * B(32x{n}, smem, K-major), s8",
                   "", int_acc_operands)


def main():
    out = [
        "// Generated by scripts/gen_wgmma.py; do not edit by hand.",
        "// wgmma.mma_async wrappers for the shapes the kernels use (f32 accumulators; s32 for s8).",
        "#pragma once",
        "#include <cstdint>",
        "#include <cuda_bf16.h>",
        "#include <cuda_fp16.h>",
        "#include <cuda_fp8.h>",
        "",
        "namespace warpattn::ptx {",
        "",
        "template <class Element, int N>",
        "struct WgmmaSS;  // only the generated shapes exist",
        "template <class Element, int N>",
        "struct WgmmaRS;",
        "template <class Element, int N>",
        "struct WgmmaSSTransposed;",
        "template <class Element, int N>",
        "struct WgmmaSSTransposedA;",
        "",
    ]
    for ctype, ptx in TYPES:
        for n in SS_N:
            out.append(ss(ctype, ptx, n))
        for n in RS_N:
            out.append(rs(ctype, ptx, n))
        for n in SS_TRANSPOSED_N:
            out.append(ss_transposed(ctype, ptx, n))
        for n in SS_TRANSPOSED_A_N:
            out.append(ss_transposed_a(ctype, ptx, n))
    for n in FP8_SS_N:
        out.append(ss_fp8(n))
    for n in FP8_RS_N:
        out.append(rs_fp8(n))
    for n in S8_SS_N:
        out.append(ss_s8(n))
    out.append("}  // namespace warpattn::ptx")
    path = pathlib.Path(__file__).resolve().parent.parent / "src/hopper/ptx/wgmma_ops.cuh"
    path.write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
