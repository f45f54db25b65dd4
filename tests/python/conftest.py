"""Shared by the Python test files."""
import numpy as np
import pytest


def gpu_missing():
    """Why the GPU tests cannot run here (None: they can): PyTorch and an sm_90 device."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability() != (9, 0):
        return "needs an sm_90 GPU, found sm_%d%d" % torch.cuda.get_device_capability()
    return None


# The model options' argument errors every entry point reports with the library's rules and
# messages (window_size, softcap, sinks for 8 query heads): (keywords, error type, message).
MODEL_OPTION_ERRORS = [
    (dict(window_size=(-4, 0)), ValueError, r"^options\.window_left: .* got -4$"),
    (dict(window_size=(0, 2), causal=True), ValueError, r"^options\.window_right: causal attention"),
    (dict(softcap=float("nan")), ValueError, r"^options\.softcap: expected 0 \(off\) or a finite value > 0"),
    (dict(sinks=np.zeros(2, np.float32)), ValueError, r"^sinks: expected shape \(8\)"),
    (dict(sinks=np.zeros(8, np.int32)), TypeError, r"^sinks: expected a float32 tensor"),
    (dict(window_size=(1,)), ValueError, r"^window_size: expected a pair"),
]


@pytest.fixture
def op_recording_backend():
    """(backend, ops): a torch.compile backend that records the call_function targets of the
    forward and backward graphs AOTAutograd makes (to see which custom ops a traced function
    calls), and runs them eagerly."""
    ops = []

    def backend(graph, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

        def compiler(g, _):
            ops.extend(str(n.target) for n in g.graph.nodes if n.op == "call_function")
            return make_boxed_func(g.forward)
        return aot_module_simplified(graph, example_inputs, fw_compiler=compiler, bw_compiler=compiler)
    return backend, ops


def visible_keys(sq, sk, causal, window_size):
    """(sq, sk) booleans: query i sees key j (bottom-right aligned: row i's diagonal is key
    i + sk - sq; causal is right = 0; a window side of -1 is unbounded)."""
    diagonal = np.arange(sq)[:, None] + sk - sq
    key = np.arange(sk)[None, :]
    keep = np.ones((sq, sk), bool)
    left, right = window_size
    if causal:
        keep &= key <= diagonal
    if left >= 0:
        keep &= key >= diagonal - left
    if right >= 0:
        keep &= key <= diagonal + right
    return keep


def _attention_reference(q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, sinks=None, softmax_scale=None):
    """Attention in float64 on the CPU with the forward's model options (issue 19), from arrays
    NumPy can read, in (batch, seqlen, heads, head_dim) layout: P = softmax(mask(softcap(scale
    q k^T))), each query head's sink one more logit of its denominator (a key without a value).
    GQA by repeating k and v; the causal mask and the window aligned bottom-right (query row i's
    diagonal is key i + Sk - Sq, and it sees keys diagonal - left to diagonal + right, -1 leaving
    a side unbounded). Returns out (B, Sq, Hq, D), lse (B, Hq, Sq) and seen (Sq,), whether each
    row sees a key: a row that sees none gets out 0 and lse its sink (-inf without sinks)."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    k, v = (np.repeat(t, hq // hkv, axis=2).transpose(0, 2, 1, 3) for t in (k, v))  # (B, Hq, Sk, D)
    scale = 1 / np.sqrt(d) if softmax_scale is None else softmax_scale
    scores = q.transpose(0, 2, 1, 3) @ k.transpose(0, 1, 3, 2) * scale  # (B, Hq, Sq, Sk)
    if softcap:
        scores = softcap * np.tanh(scores / softcap)
    keep = visible_keys(sq, sk, causal, window_size)
    scores = np.where(keep, scores, -np.inf)
    logits = scores
    if sinks is not None:
        column = np.broadcast_to(np.asarray(sinks, np.float64)[None, :, None, None], (b, hq, sq, 1))
        logits = np.concatenate([scores, column], axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        top = logits.max(-1, keepdims=True, initial=-np.inf)  # a sequence may have no keys at all
        top = np.where(np.isfinite(top), top, 0.0)
        lse = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
        p = np.where(keep, np.exp(scores - lse[..., None]), 0.0)
    out = (p @ v).transpose(0, 2, 1, 3)
    return out, lse, keep.any(-1)


@pytest.fixture
def attention_reference():
    """_attention_reference: the float64 reference of the window, softcap and sinks tests."""
    return _attention_reference


def _attention_reference_grads(q, k, v, dout, causal=False, window_size=(-1, -1), softcap=0.0, sinks=None,
                               softmax_scale=None):
    """The gradients of _attention_reference's out, in float64 on the CPU, given dout: the chain
    rule written out (test_cpu.py holds it against central differences of _attention_reference):
    dV = P^T dO, dP = dO V^T, D_i = rowsum(dO_i * O_i), dS = P (dP - D) on the logits, through
    softcap's derivative 1 - tanh^2 and the scale to dQ and dK (dK, dV summed over each group's
    query heads), and each sink a logit with no value: dsink_h = -sum_i exp(sink_h - lse_i) D_i.
    Returns dict(dq, dk, dv, dsinks (None without sinks), sink_terms (Hq,): sum_i
    exp(sink_h - lse_i) |D_i|, the magnitude dsinks' sum is bounded against)."""
    q, k, v, dout = (np.asarray(t, np.float64) for t in (q, k, v, dout))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    out, lse, _ = _attention_reference(q, k, v, causal, window_size, softcap, sinks, softmax_scale)
    scale = 1 / np.sqrt(d) if softmax_scale is None else softmax_scale
    qt = q.transpose(0, 2, 1, 3)  # (B, Hq, Sq, D)
    kt, vt = (np.repeat(t, group, axis=2).transpose(0, 2, 1, 3) for t in (k, v))  # (B, Hq, Sk, D)
    do, o = dout.transpose(0, 2, 1, 3), out.transpose(0, 2, 1, 3)
    x = qt @ kt.transpose(0, 1, 3, 2) * scale
    scores = softcap * np.tanh(x / softcap) if softcap else x
    keep = visible_keys(sq, sk, causal, window_size)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(keep, np.exp(np.where(keep, scores, 0.0) - lse[..., None]), 0.0)
    dv = p.transpose(0, 1, 3, 2) @ do
    dp = do @ vt.transpose(0, 1, 3, 2)
    big_d = (do * o).sum(-1)  # (B, Hq, Sq)
    ds = p * (dp - big_d[..., None])
    if softcap:
        ds = ds * (1 - np.tanh(x / softcap) ** 2)
    dq = (ds @ kt * scale).transpose(0, 2, 1, 3)
    dk = ds.transpose(0, 1, 3, 2) @ qt * scale

    def per_kv_head(t):  # (B, Hq, Sk, D) -> (B, Sk, Hkv, D), summed over each group (D: q's or v's)
        return t.reshape(b, hkv, group, sk, t.shape[-1]).sum(2).transpose(0, 2, 1, 3)
    result = dict(dq=dq, dk=per_kv_head(dk), dv=per_kv_head(dv), dsinks=None, sink_terms=None)
    if sinks is not None:
        with np.errstate(invalid="ignore"):
            weight = np.exp(np.asarray(sinks, np.float64)[None, :, None] - lse)  # (B, Hq, Sq)
        weight = np.where(np.isfinite(lse), weight, 1.0)  # lse is finite with sinks; guard anyway
        result["dsinks"] = -(weight * big_d).sum((0, 2))
        result["sink_terms"] = (weight * np.abs(big_d)).sum((0, 2))
    return result


@pytest.fixture
def attention_reference_grads():
    """_attention_reference_grads: the float64 reference of the gradient tests through the
    window, softcap and sinks."""
    return _attention_reference_grads
