"""flash_attn_with_kvcache (KV caches, dense or paged, with the new keys and values appended in
place, issue 16).

Without a GPU: the signature, every argument error on NumPy arrays (the library's rules and
messages, raised before any launch and before any write), the int cache_seqlens conversion and
what reaches the extension (a recorder in its place), and, where PyTorch is installed, its custom
ops on CPU and meta tensors (fake implementations, opcheck, the mutation of the caches, tracing
under torch.compile(fullgraph=True), no gradients). On an sm_90 GPU: dense and paged caches
(page sizes 1, 5, 16, 48 and 256) against a float64 reference on the gathered cache, append then attend
(appended rows bitwise, every other cache row unchanged), causal, GQA, cache_seqlens as an int and
as a tensor, return_lse, CUDA graph capture replayed with new lengths, torch.compile, CuPy and JAX.
GPU tests are skipped with the reason elsewhere."""
import inspect
import math

import numpy as np
import pytest

import warpattn
from conftest import MODEL_OPTION_ERRORS, gpu_missing
from warpattn import _warpattn

try:
    import torch
except ImportError:
    torch = None


gpu = pytest.mark.skipif(gpu_missing() is not None, reason=str(gpu_missing()))


# ------------------------------------------------------------------------------- CPU: errors

def caches(b=3, sq=1, hq=8, hkv=2, d=64, s_cache=128, s_new=0, pages=None, page_size=16, dtype=np.float16):
    """A valid call's arguments on NumPy arrays, as a dict of flash_attn_with_kvcache's keywords:
    q, k_cache, v_cache (dense (b, s_cache, hkv, d), or paged with `pages` pages of page_size
    keys and a (b, pages // b) block table), cache_seqlens, and k, v when s_new > 0."""
    args = dict(q=np.zeros((b, sq, hq, d), dtype), cache_seqlens=np.full(b, 5, np.int32))
    if pages is None:
        shape = (b, s_cache, hkv, d)
    else:
        shape = (pages, page_size, hkv, d)
        args["block_table"] = np.arange(pages, dtype=np.int32)[: b * (pages // b)].reshape(b, pages // b)
    args["k_cache"], args["v_cache"] = np.zeros(shape, dtype), np.zeros(shape, dtype)
    if s_new:
        args["k"], args["v"] = np.zeros((b, s_new, hkv, d), dtype), np.zeros((b, s_new, hkv, d), dtype)
    return args


def call(**kw):
    return warpattn.flash_attn_with_kvcache(**kw)


def test_exported_with_flash_attention_signature():
    assert "flash_attn_with_kvcache" in warpattn.__all__
    assert "flash_attn_with_kvcache" in warpattn.__doc__
    params = inspect.signature(warpattn.flash_attn_with_kvcache).parameters
    assert list(params) == ["q", "k_cache", "v_cache", "k", "v", "cache_seqlens", "block_table", "softmax_scale",
                            "causal", "window_size", "softcap", "sinks", "batch_invariant", "num_splits", "return_lse",
                            "out", "k_descale", "v_descale"]
    defaults = {name: p.default for name, p in params.items() if p.default is not inspect.Parameter.empty}
    assert defaults == dict(k=None, v=None, cache_seqlens=None, block_table=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, sinks=None, batch_invariant=False, num_splits=0,
                            return_lse=False, out=None, k_descale=None, v_descale=None)
    doc = warpattn.flash_attn_with_kvcache.__doc__
    assert "No gradients" in doc and "block_table" in doc and "JAX" in doc
    assert "forward_kvcache" in _warpattn.forward_kvcache.__doc__


@pytest.mark.parametrize("kind", ["dense", "paged", "append", "paged_append", "int_lengths", "no_lengths"])
def test_valid_call_on_cpu_memory_is_refused(kind):
    # Every rule passes; the host memory is refused after them, before any launch or write.
    args = {"dense": caches(), "paged": caches(pages=24, page_size=16), "append": caches(sq=4, s_new=4),
            "paged_append": caches(sq=3, s_new=3, pages=6, page_size=256), "int_lengths": caches(s_new=1),
            "no_lengths": caches()}[kind]
    if kind == "int_lengths":
        args["cache_seqlens"] = 17
    if kind == "no_lengths":
        del args["cache_seqlens"]
    with pytest.raises(TypeError, match="q: CUDA tensor required"):
        call(**args, causal=True, return_lse=True)
    with pytest.raises(TypeError, match="CUDA tensor required"):
        call(**args, out=np.zeros_like(args["q"]))
    for d in (8, 80, 200):  # padded head dims
        with pytest.raises(TypeError, match="q: CUDA tensor required"):
            call(**caches(d=d, s_new=2))


def test_new_keys_and_values_come_together_and_need_lengths():
    args = caches(s_new=2)
    v = args.pop("v")
    with pytest.raises(ValueError, match=r"^v: the new keys and values come together, got k alone$"):
        call(**args)
    args["v"], k = v, args.pop("k")
    with pytest.raises(ValueError, match=r"^k: the new keys and values come together, got v alone$"):
        call(**args)
    args["k"] = k
    del args["cache_seqlens"]
    with pytest.raises(ValueError, match=r"^cache_seqlens: needed to append k and v"):
        call(**args)


def test_new_keys_and_values_shapes():
    args = caches(s_new=2)
    args["k"] = args["v"] = np.zeros((3, 2, 4, 64), np.float16)  # heads of the cache: 2
    with pytest.raises(ValueError, match=r"^k: expected shape \(3, 2, 2, 64\) \(batch as q, heads and head_dim as k_cache\)"):
        call(**args)
    args = caches(s_new=2)
    args["v"] = np.zeros((3, 3, 2, 64), np.float16)
    with pytest.raises(ValueError, match=r"^v: expected shape \(3, 2, 2, 64\)"):
        call(**args)
    args = caches(s_new=2)
    args["k"] = args["k"].astype(np.float32)
    with pytest.raises(ValueError, match=r"^k: expected dtype float16 \(same as q\), got float32"):
        call(**args)


def test_lengths_and_block_table_dtypes_and_shapes():
    args = caches(pages=24)
    with pytest.raises(TypeError, match=r"^cache_seqlens: expected an int32 tensor"):
        call(**dict(args, cache_seqlens=np.zeros(3, np.int64)))
    with pytest.raises(TypeError, match=r"^block_table: expected an int32 tensor"):
        call(**dict(args, block_table=args["block_table"].astype(np.int64)))
    with pytest.raises(ValueError, match=r"^cache_seqlens: expected 3 entries \(batch, one per sequence of q\), got 4"):
        call(**dict(args, cache_seqlens=np.zeros(4, np.int32)))
    with pytest.raises(ValueError, match=r"^cache_seqlens: must be contiguous"):
        call(**dict(args, cache_seqlens=np.zeros(6, np.int32)[::2]))
    with pytest.raises(ValueError, match=r"^block_table: expected shape \(3, 8\) \(batch as q, max_pages\)"):
        call(**dict(args, block_table=np.zeros((2, 8), np.int32)))
    with pytest.raises(ValueError, match="block_table"):
        call(**dict(args, block_table=np.zeros((3, 16), np.int32)[:, ::2]))  # last dimension not contiguous
    with pytest.raises(TypeError, match=r"block_table: expected a DLPack tensor .* got builtins.list"):
        call(**dict(args, block_table=[[0, 1]]))


@pytest.mark.parametrize("d", [264, 384, 512])
@pytest.mark.parametrize("kind", ["dense", "paged_append"])
def test_head_dims_to_512_pass_the_rules(d, kind):
    # Above 256 the KV-cache forward runs the 512 kernel (padded dims in it): every argument rule
    # passes, the NumPy arrays refused only for not being on a GPU.
    args = caches(d=d) if kind == "dense" else caches(sq=3, s_new=3, pages=6, page_size=16, d=d)
    with pytest.raises(TypeError, match=r"^q: CUDA tensor required"):
        call(**args)


@pytest.mark.parametrize("page_size", [1, 5, 8, 24, 48])
def test_any_page_size_passes_the_rules(page_size):
    # Every argument rule passes (the NumPy arrays are refused only for not being on a GPU);
    # page_size 0 is the C++ tests' (test_kvcache.cpp: NumPy gives an empty array 0 strides).
    with pytest.raises(TypeError, match=r"^q: CUDA tensor required"):
        call(**caches(pages=6, page_size=page_size))


def test_tensor_rules_of_the_dense_forward_apply():
    args = caches()
    with pytest.raises(ValueError, match=r"^q: expected rank 4 \(batch, seqlen, heads, head_dim\), got rank 3"):
        call(**dict(args, q=args["q"][0]))
    with pytest.raises(ValueError, match=r"query heads \(8\) must be a multiple of key/value heads \(3\)"):
        call(**caches(hkv=3))
    with pytest.raises(ValueError, match=r"^q: head_dim \(shape\[3\]\) must be a multiple of 8 from 8 to 512, got 100$"):
        call(**caches(d=100))
    with pytest.raises(ValueError, match=r"^q: head_dim \(shape\[3\]\) must be a multiple of 8 from 8 to 512, got 520$"):
        call(**caches(d=520))
    with pytest.raises(ValueError, match=r"^k_cache: expected dtype float16 \(same as q\), got float32"):
        call(**dict(args, k_cache=args["k_cache"].astype(np.float32)))
    with pytest.raises(TypeError, match=r"^q: expected a float16, bfloat16 or float32 tensor"):
        call(**dict(args, q=args["q"].astype(np.int16)))
    with pytest.raises(TypeError, match=r"k_cache: expected a DLPack tensor \(PyTorch, JAX, CuPy or NumPy\), got builtins.list"):
        call(**dict(args, k_cache=[1, 2]))
    with pytest.raises(ValueError, match="out: must not overlap q"):
        call(**dict(args, out=args["q"]))
    with pytest.raises(ValueError, match="out: expected shape"):
        call(**dict(args, out=np.zeros((3, 2, 8, 64), np.float16)))
    with pytest.raises(ValueError, match="softmax_scale: expected a finite positive value"):
        call(**args, softmax_scale=-1.0)
    with pytest.raises(ValueError, match=r"q: last dimension .* must be contiguous"):
        call(**dict(args, q=np.zeros((3, 1, 8, 128), np.float16)[..., ::2]))


def test_appended_caches_must_not_overlap_the_new_rows():
    # The caches are written when the call appends: the new keys may not be a view of them.
    args = caches(s_new=2)
    with pytest.raises(ValueError, match="must not overlap"):
        call(**dict(args, k=args["k_cache"][:, :2]))
    # Without k and v nothing writes the caches: q may alias them (read only).
    args = caches(hq=2)
    with pytest.raises(TypeError, match="q: CUDA tensor required"):
        call(**dict(args, q=args["k_cache"][:, :1]))


def test_model_options_reach_the_library():
    args = caches()
    for options, error, message in MODEL_OPTION_ERRORS:
        with pytest.raises(error, match=message):
            call(**args, **options)
    with pytest.raises(TypeError, match="q: CUDA tensor required"):
        call(**args, causal=True, window_size=(10, 0), softcap=5.0, sinks=np.zeros(8, np.float32),
             batch_invariant=True)


@pytest.mark.parametrize("bad, error, message", [
    (True, TypeError, r"^cache_seqlens: expected an int32 tensor \(batch,\) or an int, got bool$"),
    (2.0, TypeError, r"^cache_seqlens: expected an int32 tensor \(batch,\) or an int, got builtins.float$"),
    ("5", TypeError, r"^cache_seqlens: expected an int32 tensor \(batch,\) or an int, got builtins.str$"),
    (-1, ValueError, r"^cache_seqlens: expected an int from 0 to 2\^31 - 1 \(keys in each cache\), got -1$"),
    (2 ** 31, ValueError, r"^cache_seqlens: expected an int from 0 to 2\^31 - 1"),
])
def test_int_cache_seqlens_errors(bad, error, message):
    with pytest.raises(error, match=message):
        call(**dict(caches(), cache_seqlens=bad))


@pytest.fixture
def host_kvcache(monkeypatch):
    """_warpattn.forward_kvcache replaced by a recorder of its arguments (positional ones as a
    dict by the binding's names, then the keywords)."""
    seen = []
    names = ["q", "k_cache", "v_cache", "out", "lse", "k", "v", "cache_seqlens", "block_table", "softmax_scale",
             "causal", "stream", "batch_invariant"]

    def forward_kvcache(*args, **options):
        seen.append(dict(zip(names, args), **options))
    monkeypatch.setattr(_warpattn, "forward_kvcache", forward_kvcache)
    return seen


@pytest.mark.parametrize("n", [0, 1, 1000, np.int64(7)])
def test_int_cache_seqlens_become_an_int32_tensor(host_kvcache, n):
    # FlashAttention's convenience: an int is a (batch,) int32 tensor filled with it, of q's
    # framework (here NumPy), whatever the layout (paged: batch is q's, not the caches' first axis).
    for args in (caches(b=3), caches(b=3, pages=24)):
        call(**dict(args, cache_seqlens=n))
        got = host_kvcache[-1]["cache_seqlens"]
        assert isinstance(got, np.ndarray) and got.dtype == np.int32 and got.shape == (3,)
        assert np.all(got == int(n))
    tensor = np.arange(3, dtype=np.int32)
    call(**dict(caches(), cache_seqlens=tensor))
    assert host_kvcache[-1]["cache_seqlens"] is tensor  # a tensor goes as it is
    call(**dict(caches(), cache_seqlens=None))
    assert host_kvcache[-1]["cache_seqlens"] is None


def test_what_reaches_the_extension(host_kvcache):
    args = caches(b=2, sq=3, s_new=3, pages=8, page_size=256)
    out = call(**args, causal=True, softmax_scale=0.5, window_size=(64, 0), softcap=30.0, batch_invariant=True)
    got = host_kvcache[-1]
    assert isinstance(out, np.ndarray) and out is got["out"] and out.shape == (2, 3, 8, 64) and out.dtype == np.float16
    for name in ("q", "k_cache", "v_cache", "k", "v", "cache_seqlens", "block_table"):
        assert got[name] is args[name], name
    assert got["lse"] is None and got["causal"] is True and got["softmax_scale"] == 0.5 and got["batch_invariant"]
    assert (got["window_left"], got["window_right"], got["softcap"], got["sinks"]) == (64, 0, 30.0, None)
    # return_lse: a tuple (out, lse) as flash_attn_func's, lse (batch, heads, seqlen_q) float32
    result = call(**args, return_lse=True)
    assert isinstance(result, tuple) and len(result) == 2
    out, lse = result
    assert lse is host_kvcache[-1]["lse"] and lse.shape == (2, 8, 3) and lse.dtype == np.float32
    # out=: written and handed back
    mine = np.empty((2, 3, 8, 64), np.float16)
    assert call(**args, out=mine) is mine and host_kvcache[-1]["out"] is mine
    # the value head dim is the caches'
    args = caches(b=2, d=64)
    args["v_cache"] = np.zeros((2, 128, 2, 32), np.float16)
    assert call(**args).shape == (2, 1, 8, 32)


def test_tensors_of_one_framework():
    args = caches()
    args["block_table"] = object()
    with pytest.raises(TypeError, match="block_table: expected a DLPack tensor"):
        call(**args)


# ------------------------------------------------------- PyTorch on CPU and meta tensors (no GPU)

@pytest.fixture
def torch_ops():
    if torch is None:
        pytest.skip("PyTorch is not installed")
    import warpattn.torch_op as ops
    return ops


def meta_caches(b=2, sq=4, hq=8, hkv=2, d=64, s_cache=96, s_new=4, device="meta"):
    def t(*shape):
        return torch.zeros(shape, device=device, dtype=torch.bfloat16)
    lengths = torch.zeros(b, device=device, dtype=torch.int32)
    return t(b, sq, hq, d), t(b, s_cache, hkv, d), t(b, s_cache, hkv, d), t(b, s_new, hkv, d), t(b, s_new, hkv, d), \
        lengths


def test_torch_fake_implementations(torch_ops):
    q, kc, vc, k, v, lengths = meta_caches()
    out, lse = torch.ops.warpattn.flash_attn_kvcache_forward(q, kc, vc, lengths, None, None, True)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert lse.shape == (2, 8, 4) and lse.dtype == torch.float32
    out, lse = torch.ops.warpattn.flash_attn_kvcache_append_forward(q, kc, vc, k, v, lengths, None, 0.1, False)
    assert out.shape == q.shape and lse.shape == (2, 8, 4)
    table = torch.zeros(2, 3, device="meta", dtype=torch.int32)
    paged = torch.zeros(6, 32, 2, 48, device="meta", dtype=torch.bfloat16)  # v head dim 48
    out, _ = torch.ops.warpattn.flash_attn_kvcache_forward(q, paged, paged, None, table, None, False)
    assert out.shape == (2, 4, 8, 48)


def test_torch_op_schemas_declare_the_mutated_caches(torch_ops):
    attend = torch.ops.warpattn.flash_attn_kvcache_forward.default._schema
    append = torch.ops.warpattn.flash_attn_kvcache_append_forward.default._schema
    assert not any(a.alias_info is not None and a.alias_info.is_write for a in attend.arguments)
    written = [a.name for a in append.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["k_cache", "v_cache"]


@pytest.fixture
def host_append(torch_ops, monkeypatch):
    """_warpattn.forward_kvcache replaced, on CPU tensors, by what it does to the caches (dense
    only: the new rows written at cache_seqlens[b]) and out = 1, lse = 2: the custom ops then run
    their real implementations, so opcheck and torch.compile see the caches mutated."""
    calls = []

    def forward_kvcache(q, k_cache, v_cache, out, lse, k, v, cache_seqlens, block_table, *rest, **options):
        calls.append(dict(cache_seqlens=cache_seqlens, options=options))
        if k is not None:
            for b, n in enumerate(cache_seqlens.tolist()):
                k_cache[b, n:n + k.shape[1]] = k[b]
                v_cache[b, n:n + v.shape[1]] = v[b]
        out.fill_(1.0)
        if lse is not None:
            lse.fill_(2.0)
    monkeypatch.setattr(_warpattn, "forward_kvcache", forward_kvcache)
    return calls


def test_torch_opcheck(torch_ops, host_append):
    q, kc, vc, k, v, lengths = meta_caches(device="cpu")
    k.normal_()
    v.normal_()
    lengths.copy_(torch.tensor([3, 50], dtype=torch.int32))
    torch.library.opcheck(torch_ops.flash_attn_kvcache_forward, (q, kc, vc, lengths, None, None, True))
    torch.library.opcheck(torch_ops.flash_attn_kvcache_append_forward, (q, kc, vc, k, v, lengths, None, None, True))


def test_torch_append_mutates_the_caches_and_int_lengths(torch_ops, host_append):
    q, kc, vc, k, v, _ = meta_caches(device="cpu")
    k.normal_()
    v.normal_()
    out, lse = warpattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=10, causal=True, return_lse=True,
                                                window_size=(32, 0))
    lengths = host_append[-1]["cache_seqlens"]
    assert lengths.dtype == torch.int32 and lengths.shape == (2,) and lengths.tolist() == [10, 10]
    assert host_append[-1]["options"]["window_left"] == 32
    assert torch.equal(kc[:, 10:14], k) and torch.equal(vc[:, 10:14], v) and not kc[:, :10].any()
    assert torch.all(out == 1) and torch.all(lse == 2) and lse.shape == (2, 8, 4)


@pytest.fixture
def call_recording_backend():
    """(backend, calls): conftest's op_recording_backend, each call recorded with its arguments,
    since a mutating op is traced functionalised: auto_functionalized(the op, ...)."""
    calls = []

    def backend(graph, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

        def compiler(g, _):
            calls.extend("%s%s" % (n.target, n.args) for n in g.graph.nodes if n.op == "call_function")
            return make_boxed_func(g.forward)
        return aot_module_simplified(graph, example_inputs, fw_compiler=compiler, bw_compiler=compiler)
    return backend, calls


def test_torch_compile_fullgraph_traces_the_append(torch_ops, host_append, call_recording_backend):
    q, kc, vc, k, v, lengths = meta_caches(device="cpu")
    k.normal_()
    v.normal_()
    lengths.copy_(torch.tensor([0, 40], dtype=torch.int32))
    backend, ops = call_recording_backend

    def step(q, kc, vc, k, v, lengths):
        return warpattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lengths, causal=True) * 2
    out = torch.compile(step, backend=backend, fullgraph=True)(q, kc, vc, k, v, lengths)
    assert any("flash_attn_kvcache_append_forward" in op for op in ops)
    assert torch.all(out == 2)
    # the mutation of the caches (functionalised in the graph) reaches the caller's tensors
    assert torch.equal(kc[0, :4], k[0]) and torch.equal(vc[1, 40:44], v[1]) and not kc[0, 4:].any()
    ops.clear()

    def attend(q, kc, vc):
        return warpattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=7, return_lse=True)
    out, lse = torch.compile(attend, backend=backend, fullgraph=True)(q, kc, vc)
    assert any("flash_attn_kvcache_forward" in op for op in ops) and lse.shape == (2, 8, 4)
    assert host_append[-1]["cache_seqlens"].tolist() == [7, 7]


def test_torch_no_gradients(torch_ops, host_append):
    q, kc, vc, k, v, lengths = meta_caches(device="cpu")
    q.requires_grad_(True)
    out = warpattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths)
    with pytest.raises(RuntimeError, match="no autograd formula was registered"):
        out.float().sum().backward()


def test_torch_eager_decode_step_passes_what_the_op_passes(torch_ops, host_kvcache, monkeypatch):
    # An eager decode step (nothing appended, no lse, no out, plain CUDA tensors) calls the binding
    # straight from torch_op.flash_attn_kvcache_torch (issue 16's host cost), not through the
    # custom op: what it passes must be what the op passes, except the lse nobody asked for, which
    # it does not allocate. _may_skip_dispatcher is forced either way (these tensors are on the CPU).
    q, kc, vc, _, _, lengths = meta_caches(device="cpu")
    pages = torch.zeros(8, 16, 2, 64, dtype=torch.bfloat16)
    table = torch.arange(8, dtype=torch.int32).reshape(2, 4)
    k8 = torch.zeros(2, 96, 2, 64, dtype=torch.float8_e4m3fn)
    v8 = torch.zeros(2, 2, 6, 16 * 64, dtype=torch.float8_e4m3fn)  # an E4M3 cache's Vᵀ (any shape: not validated here)
    descale = torch.ones(2)
    cases = [dict(k_cache=kc, v_cache=vc),
             dict(k_cache=pages, v_cache=pages, block_table=table),
             dict(k_cache=kc, v_cache=torch.zeros(2, 96, 2, 32, dtype=torch.bfloat16)),  # a value head dim of its own
             dict(k_cache=k8, v_cache=v8, k_descale=descale, v_descale=descale),
             dict(k_cache=kc, v_cache=vc, causal=True, softmax_scale=0.3, window_size=(16, 0), softcap=30.0,
                  sinks=torch.zeros(8), num_splits=3, batch_invariant=True)]

    def same(a, b):
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.data_ptr() == b.data_ptr()
                    and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride())
        return a == b

    for case in cases:
        seen = {}
        for fast in (True, False):
            monkeypatch.setattr(torch_ops, "_may_skip_dispatcher", lambda args, fast=fast: fast)
            out = warpattn.flash_attn_with_kvcache(q, cache_seqlens=lengths, **case)
            seen[fast] = (dict(host_kvcache[-1]), out)
        (fast, fast_out), (op, op_out) = seen[True], seen[False]
        assert fast.keys() == op.keys(), sorted(case)
        assert fast["lse"] is None and isinstance(op["lse"], torch.Tensor), sorted(case)
        assert fast["out"] is fast_out and op["out"] is op_out, sorted(case)
        assert (fast_out.shape, fast_out.dtype) == (op_out.shape, op_out.dtype), sorted(case)
        for name in fast.keys() - {"out", "lse"}:
            assert same(fast[name], op[name]), (sorted(case), name)


def test_torch_argument_errors_keep_the_library_messages(torch_ops):
    q, kc, vc, k, v, lengths = meta_caches(device="cpu")
    with pytest.raises(ValueError, match=r"^v: the new keys and values come together, got k alone$"):
        warpattn.flash_attn_with_kvcache(q, kc, vc, k, cache_seqlens=lengths)
    with pytest.raises(ValueError, match=r"^cache_seqlens: needed to append k and v"):
        warpattn.flash_attn_with_kvcache(q, kc, vc, k, v)
    with pytest.raises(TypeError, match=r"^cache_seqlens: expected an int32 tensor"):
        warpattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths.long())
    with pytest.raises(TypeError, match="q: CUDA tensor required"):
        warpattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lengths)
    assert not kc.any()  # refused before any write


# -------------------------------------------------------------------- JAX, no GPU

def test_jax_refusals():
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    import jax.numpy as jnp
    q = jnp.zeros((2, 1, 4, 64), jnp.bfloat16)
    cache = jnp.zeros((2, 32, 4, 64), jnp.bfloat16)
    new = jnp.zeros((2, 1, 4, 64), jnp.bfloat16)
    with pytest.raises(TypeError, match="k, v: JAX arrays are immutable"):
        warpattn.flash_attn_with_kvcache(q, cache, cache, new, new, cache_seqlens=3)
    with pytest.raises(ValueError, match="out: JAX arrays are immutable"):
        warpattn.flash_attn_with_kvcache(q, cache, cache, out=q)
    # Without the XLA FFI handlers (or with them set aside), JAX arrays run eagerly only.
    from warpattn import api
    prefer, api._PREFER_JAX_FFI = api._PREFER_JAX_FFI, False
    try:
        with pytest.raises(TypeError, match="not traced ones under jax.jit"):
            jax.jit(lambda q: warpattn.flash_attn_with_kvcache(q, cache, cache))(q)
    finally:
        api._PREFER_JAX_FFI = prefer


# ------------------------------------------------------------------------------ GPU helpers

TOL = {torch.bfloat16: 5e-3, torch.float16: 1e-3} if torch is not None else {}  # rel L2, as test_varlen.py


def rel_l2(got, want):
    got, want = torch.as_tensor(got).double().cpu(), torch.as_tensor(want).double().cpu()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def make_cache(b, hkv, d, dtype, capacity, page_size=None, seed=0):
    """(k_cache, v_cache, block_table): random finite caches of `capacity` keys per sequence,
    dense (b, capacity, hkv, d), or paged in pages of page_size keys with a block table that
    scatters each sequence's pages over the pool in a random order (plus spare pages)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if page_size is None:
        shape, table = (b, capacity, hkv, d), None
    else:
        per_seq = -(-capacity // page_size)
        num_pages = b * per_seq + 3
        shape = (num_pages, page_size, hkv, d)
        perm = torch.randperm(num_pages, generator=gen, device="cuda")[: b * per_seq]
        table = perm.to(torch.int32).reshape(b, per_seq).contiguous()
    k_cache = torch.randn(shape, device="cuda", dtype=dtype, generator=gen)
    v_cache = torch.randn(shape, device="cuda", dtype=dtype, generator=gen)
    return k_cache, v_cache, table


def gather(cache, table, b, n):
    """Sequence b's first n keys of a cache, dense or paged: (n, hkv, d)."""
    if table is None:
        return cache[b, :n]
    page_size = cache.shape[1]
    rows = torch.arange(n, device=cache.device)
    return cache[table[b].long()[rows // page_size], rows % page_size]


def appended(cache, table, new, lengths):
    """The cache after writing new (b, s_new, hkv, d) at rows lengths[b] of each sequence: a copy."""
    cache = cache.clone()
    for b, n in enumerate(lengths):
        rows = torch.arange(n, n + new.shape[1], device=cache.device)
        if table is None:
            cache[b, rows] = new[b]
        else:
            page_size = cache.shape[1]
            cache[table[b].long()[rows // page_size], rows % page_size] = new[b]
    return cache


def check_against_reference(q, k_cache, v_cache, table, lens, out, lse, attention_reference, causal=False,
                            **options):
    """Each sequence b of out (and lse, when given) against the float64 reference over the first
    lens[b] keys of its cache gathered (bottom-right alignment, GQA, the model options)."""
    for b, n in enumerate(lens):
        kb, vb = gather(k_cache, table, b, n), gather(v_cache, table, b, n)
        sinks = options.get("sinks")
        want, want_lse, seen = attention_reference(
            q[b:b + 1].double().cpu().numpy(), kb[None].double().cpu().numpy(), vb[None].double().cpu().numpy(),
            causal=causal, window_size=options.get("window_size", (-1, -1)), softcap=options.get("softcap", 0.0),
            sinks=None if sinks is None else sinks.double().cpu().numpy(), softmax_scale=options.get("softmax_scale"))
        what = "sequence %d (%d keys)" % (b, n)
        got = out[b].double().cpu()
        assert not got.isnan().any(), what + ": NaN"
        want = torch.from_numpy(want[0])
        if seen.any():
            err = rel_l2(got[torch.from_numpy(seen)], want[torch.from_numpy(seen)])
            assert err <= TOL[q.dtype], what + ": rel L2 %.2e against float64" % err
        assert torch.all(got[torch.from_numpy(~seen)] == 0), what + ": rows that see no key are 0"
        if lse is not None:
            want_lse = torch.from_numpy(want_lse[0])
            got_lse = lse[b].double().cpu()
            finite = want_lse.isfinite()
            assert torch.equal(got_lse.isfinite(), finite), what + ": -inf LSE exactly where the reference's"
            if finite.any():
                assert (got_lse[finite] - want_lse[finite]).abs().max().item() <= 1e-3, what + ": LSE"


# ---------------------------------------------------------------------------- GPU: forward

@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16] if torch is not None else [None])
@pytest.mark.parametrize("page_size", [None, 1, 48, 16, 256])  # 1: SGLang's pages; 48: not a power of two
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hkv", [8, 2, 1])
@pytest.mark.parametrize("sq", [1, 5])
def test_attend_over_the_cache(dtype, page_size, causal, hkv, sq, attention_reference):
    # No append: lengths from 0 (no key) to the capacity; q of 1 (decode) or 5 new rows.
    b, hq, d, capacity = 5, 8, 128, 700
    k_cache, v_cache, table = make_cache(b, hkv, d, dtype, capacity, page_size, seed=hkv + 3 * causal + sq)
    lens = [0, 1, 37, 256, capacity if page_size is None else table.shape[1] * page_size]
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
    lengths = torch.tensor(lens, device="cuda", dtype=torch.int32)
    before = k_cache.clone(), v_cache.clone()
    out, lse = warpattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, block_table=table,
                                                causal=causal, return_lse=True)
    assert out.shape == q.shape and lse.shape == (b, hq, sq) and lse.dtype == torch.float32
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])  # only read
    check_against_reference(q, k_cache, v_cache, table, lens, out, lse, attention_reference, causal)
    # Without return_lse an eager call allocates no lse (torch_op.flash_attn_kvcache_torch).
    alone = warpattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, block_table=table,
                                             causal=causal)
    check_against_reference(q, k_cache, v_cache, table, lens, alone, None, attention_reference, causal)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 64])
@pytest.mark.parametrize("num_splits", [1, 2, 5, 128])
def test_forced_splits(page_size, num_splits, attention_reference):
    # Split keys (flash-decoding): every forced count, empty pieces included (128 pieces of a
    # 700-key range), gives the reference's result; the default's choice agrees within the bound.
    b, hq, hkv, d, capacity, dtype = 3, 16, 4, 128, 700, torch.bfloat16
    k_cache, v_cache, table = make_cache(b, hkv, d, dtype, capacity, page_size, seed=num_splits)
    full = capacity if page_size is None else table.shape[1] * page_size
    lens = [full, 1, 450]
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=dtype)
    lengths = torch.tensor(lens, device="cuda", dtype=torch.int32)
    out, lse = warpattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, block_table=table,
                                                causal=True, num_splits=num_splits, return_lse=True)
    check_against_reference(q, k_cache, v_cache, table, lens, out, lse, attention_reference, True)
    default = warpattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, block_table=table,
                                               causal=True)
    assert float((default.float() - out.float()).abs().max()) < 2e-2


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("d", [512, 384])
@pytest.mark.parametrize("page_size", [None, 1, 16, 256])
@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("s_new", [0, 2])
def test_head_dim_512(d, page_size, num_splits, s_new, attention_reference):
    # Head dims above 256 in the 512 kernel (both consumer warpgroups on 64 packed rows, each half
    # of the head dim): decode and chunked steps, dense and paged, append, split keys, GQA.
    b, hq, hkv, capacity, dtype = 3, 16, 2, 400, torch.bfloat16 if s_new else torch.float16
    causal = s_new > 0 or num_splits == 3
    k_cache, v_cache, table = make_cache(b, hkv, d, dtype, capacity, page_size, seed=d + num_splits + s_new)
    full = capacity if page_size is None else table.shape[1] * page_size
    lens = [0, full - s_new, 130]
    lengths = torch.tensor(lens, device="cuda", dtype=torch.int32)
    sq = max(s_new, 1) if causal else 5
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
    extra = {}
    if s_new:
        k, v = (torch.randn(b, s_new, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
        want_k, want_v = appended(k_cache, table, k, lens), appended(v_cache, table, v, lens)
        extra = dict(k=k, v=v)
    out, lse = warpattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, block_table=table,
                                                causal=causal, num_splits=num_splits, return_lse=True, **extra)
    assert out.shape == q.shape and lse.shape == (b, hq, sq)
    if s_new:
        assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    check_against_reference(q, k_cache, v_cache, table, [n + s_new for n in lens], out, lse, attention_reference,
                            causal)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 5, 16, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hkv", [4, 1])
@pytest.mark.parametrize("s_new", [1, 3, 40])
def test_append_then_attend(page_size, causal, hkv, s_new, attention_reference):
    # The new rows land in the caches bitwise at cache_seqlens[b] on, every other row unchanged,
    # and the attention sees len = cache_seqlens[b] + s_new keys (bottom-right causal).
    b, hq, d, capacity, dtype = 4, 8, 64, 600, torch.bfloat16
    k_cache, v_cache, table = make_cache(b, hkv, d, dtype, capacity, page_size, seed=s_new + hkv + causal)
    lens = [0, 15, 16, 500]  # 15 and 16: an append across a page boundary and one at its start
    lengths = torch.tensor(lens, device="cuda", dtype=torch.int32)
    q = torch.randn(b, s_new, hq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, s_new, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    want_k, want_v = appended(k_cache, table, k, lens), appended(v_cache, table, v, lens)
    out, lse = warpattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths, block_table=table,
                                                causal=causal, return_lse=True)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    assert lengths.tolist() == lens  # not advanced (FlashAttention's convention)
    check_against_reference(q, k_cache, v_cache, table, [n + s_new for n in lens], out, lse, attention_reference,
                            causal)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 16, 256])
def test_int_cache_seqlens_equal_a_tensor(page_size, attention_reference):
    b, hq, hkv, d, dtype = 3, 8, 2, 128, torch.float16
    k_cache, v_cache, table = make_cache(b, hkv, d, dtype, 512, page_size, seed=21)
    q = torch.randn(b, 2, hq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, 2, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    caches = [(k_cache.clone(), v_cache.clone()) for _ in range(2)]
    by_int = warpattn.flash_attn_with_kvcache(q, *caches[0], k, v, cache_seqlens=300, block_table=table, causal=True)
    lengths = torch.full((b,), 300, device="cuda", dtype=torch.int32)
    by_tensor = warpattn.flash_attn_with_kvcache(q, *caches[1], k, v, cache_seqlens=lengths, block_table=table,
                                                 causal=True)
    assert torch.equal(by_int, by_tensor)
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    check_against_reference(q, *caches[0], table, [302] * b, by_int, None, attention_reference, True)
    # without cache_seqlens every cache is full
    full = warpattn.flash_attn_with_kvcache(q, k_cache, v_cache, block_table=table)
    n = 512 if page_size is None else table.shape[1] * page_size
    check_against_reference(q, k_cache, v_cache, table, [n] * b, full, None, attention_reference)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 16])
def test_model_options_and_out(page_size, attention_reference):
    b, hq, hkv, d, dtype = 3, 8, 2, 128, torch.bfloat16
    k_cache, v_cache, table = make_cache(b, hkv, d, dtype, 400, page_size, seed=22)
    q = torch.randn(b, 4, hq, d, device="cuda", dtype=dtype)
    lens = [4, 200, 400]
    lengths = torch.tensor(lens, device="cuda", dtype=torch.int32)
    options = dict(causal=True, window_size=(64, 0), softcap=20.0, softmax_scale=0.1,
                   sinks=torch.linspace(-2.0, 8.0, hq, device="cuda", dtype=torch.float32))
    out = torch.empty_like(q)
    result, lse = warpattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, block_table=table,
                                                   return_lse=True, out=out, **options)
    assert result is out
    check_against_reference(q, k_cache, v_cache, table, lens, out, lse, attention_reference, **options)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 256])
def test_cuda_graph_replay_with_new_lengths(page_size, attention_reference):
    # A decode step captured once: the lengths (and the new rows) are read on the device, so a
    # replay appends at and attends over the lengths of that moment.
    b, hq, hkv, d, dtype = 4, 8, 2, 128, torch.bfloat16
    k_cache, v_cache, table = make_cache(b, hkv, d, dtype, 1024, page_size, seed=23)
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, 1, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    lengths = torch.tensor([0, 10, 100, 1000], device="cuda", dtype=torch.int32)
    warpattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths, block_table=table)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = warpattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths,
                                                    block_table=table, return_lse=True)
    for step, lens in enumerate(([1, 11, 101, 1001], [5, 300, 16, 17])):
        lengths.copy_(torch.tensor(lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        k.copy_(torch.randn_like(k))
        v.copy_(torch.randn_like(v))
        want_k, want_v = appended(k_cache, table, k, lens), appended(v_cache, table, v, lens)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v), "replay %d: the append" % step
        check_against_reference(q, k_cache, v_cache, table, [n + 1 for n in lens], out, lse, attention_reference)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 16])
def test_torch_compile_fullgraph(page_size):
    b, hq, hkv, d, dtype = 3, 8, 2, 64, torch.bfloat16
    k_cache, v_cache, table = make_cache(b, hkv, d, dtype, 256, page_size, seed=24)
    q = torch.randn(b, 2, hq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, 2, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    lengths = torch.tensor([0, 17, 200], device="cuda", dtype=torch.int32)

    def step(q, k_cache, v_cache, k, v, lengths):
        out, lse = warpattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths,
                                                    block_table=table, causal=True, return_lse=True)
        return out * 2, lse

    eager = (k_cache.clone(), v_cache.clone())
    compiled = (k_cache.clone(), v_cache.clone())
    want = step(q, *eager, k, v, lengths)
    got = torch.compile(step, fullgraph=True)(q, *compiled, k, v, lengths)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])  # the append happened

    def attend(q, k_cache, v_cache):
        return warpattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=100, block_table=table)
    torch.testing.assert_close(torch.compile(attend, fullgraph=True)(q, *eager), attend(q, *eager), rtol=0, atol=0)


@gpu
@pytest.mark.gpu
def test_argument_errors_on_cuda_tensors():
    b, hkv, d = 2, 2, 64
    k_cache, v_cache, table = make_cache(b, hkv, d, torch.float16, 64, 16)
    q = torch.randn(b, 1, 4, d, device="cuda", dtype=torch.float16)
    with pytest.raises(TypeError, match="cache_seqlens: CUDA tensor required"):
        warpattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.zeros(b, dtype=torch.int32),
                                         block_table=table)
    with pytest.raises(TypeError, match="block_table: CUDA tensor required"):
        warpattn.flash_attn_with_kvcache(q, k_cache, v_cache, block_table=table.cpu())
    with pytest.raises(TypeError, match="block_table: expected an int32"):
        warpattn.flash_attn_with_kvcache(q, k_cache, v_cache, block_table=table.long())


@gpu
@pytest.mark.gpu
def test_cupy_inputs(attention_reference):
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    b, hq, hkv, d, dtype = 2, 4, 2, 128, torch.float16
    k_cache, v_cache, table = make_cache(b, hkv, d, dtype, 256, 16, seed=25)
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, 1, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    want_k = appended(k_cache, table, k, [7, 7])
    torch.cuda.synchronize()
    args = [cupy.from_dlpack(t) for t in (q, k_cache, v_cache, k, v, table)]
    out, lse = warpattn.flash_attn_with_kvcache(*args[:5], cache_seqlens=7, block_table=args[5], return_lse=True)
    assert isinstance(out, cupy.ndarray) and lse.shape == (b, hq, 1)
    cupy.cuda.get_current_stream().synchronize()
    assert torch.equal(k_cache, want_k)
    check_against_reference(q, k_cache, v_cache, table, [8, 8], torch.from_dlpack(out), torch.from_dlpack(lse),
                            attention_reference)


@gpu
@pytest.mark.gpu
def test_jax_inputs(attention_reference):
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    if not any(dev.platform == "gpu" for dev in jax.devices()):
        pytest.skip("JAX sees no GPU")
    b, hq, hkv, d, dtype = 2, 4, 2, 64, torch.bfloat16
    k_cache, v_cache, table = make_cache(b, hkv, d, dtype, 256, None, seed=26)
    q = torch.randn(b, 3, hq, d, device="cuda", dtype=dtype)
    lengths = torch.tensor([3, 200], device="cuda", dtype=torch.int32)
    torch.cuda.synchronize()
    args = [jax.dlpack.from_dlpack(t) for t in (q, k_cache, v_cache, lengths)]
    out, lse = warpattn.flash_attn_with_kvcache(*args[:3], cache_seqlens=args[3], causal=True, return_lse=True)
    assert isinstance(out, jax.Array)
    check_against_reference(q, k_cache, v_cache, None, [3, 200], torch.from_dlpack(out), torch.from_dlpack(lse),
                            attention_reference, True)


@pytest.mark.parametrize("bad", [-1, 129])
def test_num_splits_out_of_range(bad):
    with pytest.raises(ValueError, match=r"num_splits: expected 0 \(chosen from the shape\) or 1 to 128"):
        call(**dict(caches(), num_splits=bad))


def test_num_splits_reaches_the_library(host_kvcache):
    call(**dict(caches(), num_splits=7))
    assert host_kvcache[-1]["num_splits"] == 7
    call(**caches())
    assert host_kvcache[-1]["num_splits"] == 0


def test_decode_benchmark_sweep_and_arguments():
    # The benchmark's sweep (issue 16's points) and its argument checks, without a GPU.
    from warpattn import bench_decode
    quick = bench_decode.points(bench_decode.parse_args(["--quick"]))
    assert dict(B=8, S=4096, Hq=32, Hkv=8, d=128, Sq=1) in quick
    full = bench_decode.points(bench_decode.parse_args([]))
    assert len(full) == 3 * 5 * 3 * 1 * 3
    some = bench_decode.points(bench_decode.parse_args(["--points", "B=8", "Sq=1,4"]))
    assert some and all(p["B"] == 8 and p["Sq"] in (1, 4) for p in some)
    wide = bench_decode.points(bench_decode.parse_args(["--quick", "--head-dim", "512"]))
    assert len(wide) == len(quick) and all(p["d"] == 512 for p in wide)
    assert [dict(p, d=128) for p in wide] == quick
    assert bench_decode.moved_bytes(dict(B=8, S=4096, Hq=32, Hkv=8, d=128, Sq=1)) == 2 * 8 * 4096 * 8 * 128 * 2 + 2 * 2 * 8 * 32 * 128
    assert bench_decode.parse_args(["--splits", "0,2,8"]).split_list == [0, 2, 8]
    with pytest.raises(SystemExit):
        bench_decode.parse_args(["--points", "X=1"])
    with pytest.raises(SystemExit):
        bench_decode.parse_args(["--splits", "two"])
