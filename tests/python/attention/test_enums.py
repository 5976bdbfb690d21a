"""The Python enums and the ctypes AttnParams mirror agree with the C++ engine (params.h).

Nothing new is compiled: the engine's own validate() / select_backend() are asked about
codes at and past each enum's ends, every member is valid (given the shapes it needs), and
messages use the Python member names. Each feature test file runs every member of its enum
against the reference, which checks that the codes mean the Python members.
"""

import ctypes

import jax
import numpy as np
import pytest

import fusedattn
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SoftmaxType, _lib
from fusedattn._gpu_route import _has_gpu
from conftest import descriptor, qkv, reference_f32

OK, INVALID, UNIMPLEMENTED = _lib.STATUS_OK, _lib.STATUS_INVALID, _lib.STATUS_UNIMPLEMENTED

# enum class -> (AttnParams field, the name validate() gives the argument)
ENUMS = {
    QKVLayout: ("layout", "qkv_layout"),
    AttnMaskType: ("mask_type", "attn_mask_type"),
    AttnBiasType: ("bias_type", "attn_bias_type"),
    SoftmaxType: ("softmax_type", "softmax_type"),
}

# What a member needs besides itself to make a valid call of params(). Keyed by
# (enum, member): members of different IntEnums with one value are equal as dict keys.
NEEDS = {
    (QKVLayout, QKVLayout.BS3HD): dict(seqlen_kv=64, heads_kv=4),
    (QKVLayout, QKVLayout.T3HD): dict(seqlen_kv=64, heads_kv=4,
                                      mask_type=int(AttnMaskType.PADDING_MASK)),
    (QKVLayout, QKVLayout.THD_T2HD): dict(mask_type=int(AttnMaskType.PADDING_CAUSAL_MASK)),
    (QKVLayout, QKVLayout.THD_THD_THD): dict(
        mask_type=int(AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK)),
    (AttnBiasType, AttnBiasType.PRE_SCALE_BIAS): dict(bias_batch=1, bias_heads=4),
    (AttnBiasType, AttnBiasType.POST_SCALE_BIAS): dict(bias_batch=2, bias_heads=1),
}


def params(**overrides) -> _lib.AttnParams:
    """A valid call: q [2, 64, 4, 32], k/v [2, 80, 2, 32] bfloat16, causal."""
    p = dict(batch=2, seqlen_q=64, seqlen_kv=80, heads_q=4, heads_kv=2, head_dim_qk=32,
             head_dim_v=32, window_left=-1, window_right=-1, dtype=_lib.DTYPE_CODES["bfloat16"],
             layout=int(QKVLayout.BSHD_BSHD_BSHD), mask_type=int(AttnMaskType.CAUSAL_MASK),
             bias_type=int(AttnBiasType.NO_BIAS), softmax_type=int(SoftmaxType.VANILLA_SOFTMAX),
             is_training=1, scale=0.125, dropout=0.0, max_segments=1, bias_batch=0, bias_heads=0,
             num_slices=1)
    p.update(overrides)
    return _lib.AttnParams(**p)


def test_the_default_params_are_valid():
    assert _lib.validate(params()) == (OK, "")


def test_params_mirror_has_the_library_size():
    assert _lib.lib.fa_params_size() == ctypes.sizeof(_lib.AttnParams)


@pytest.mark.parametrize("enum", ENUMS, ids=lambda e: e.__name__)
def test_codes_past_the_ends_are_not_members(enum):
    field, arg = ENUMS[enum]
    article = "an" if enum.__name__[0] in "AEIOU" else "a"
    for code in (len(enum), len(enum) + 7, -1):
        status, msg = _lib.validate(params(**{field: code}))
        assert status == INVALID, (code, msg)
        assert msg == f"{arg}: got code {code}, not {article} {enum.__name__}", msg


@pytest.mark.parametrize("enum", ENUMS, ids=lambda e: e.__name__)
def test_every_member_is_valid(enum):
    field, _ = ENUMS[enum]
    assert [int(m) for m in enum] == list(range(len(enum))), "codes must be 0..n-1"
    for member in enum:
        needs = NEEDS.get((enum, member), {})
        status, msg = _lib.validate(params(**{field: int(member), **needs}))
        assert status == OK, (member, msg)


@pytest.mark.parametrize("layout", [QKVLayout.T3HD, QKVLayout.THD_T2HD, QKVLayout.THD_THD_THD],
                         ids=lambda l: l.name)
def test_layout_and_mask_names_in_messages(layout):
    # A THD layout without a padding mask: the message names both by their Python names.
    for mask in AttnMaskType:
        if mask.is_padding():
            continue
        shapes = dict(NEEDS[(QKVLayout, layout)], mask_type=int(mask))
        status, msg = _lib.validate(params(layout=int(layout), **shapes))
        assert status == INVALID and f"qkv_layout={layout.name}" in msg, msg
        assert f"attn_mask_type={mask.name}" in msg, msg


@pytest.mark.parametrize("bias_type", [AttnBiasType.PRE_SCALE_BIAS, AttnBiasType.POST_SCALE_BIAS],
                         ids=lambda b: b.name)
def test_bias_names_in_messages(bias_type):
    status, msg = _lib.validate(params(bias_type=int(bias_type)))  # no bias tensor
    assert status == INVALID and f"attn_bias_type={bias_type.name}" in msg, msg


def test_dtype_codes():
    # attention takes float64 too (the CPU engine in double): ATTN_DTYPE_CODES
    codes = _lib.ATTN_DTYPE_CODES
    for name, code in codes.items():
        assert _lib.validate(params(dtype=code)) == (OK, ""), name
    assert sorted(codes.values()) == list(range(len(codes)))
    for code in (len(codes), -1):
        status, msg = _lib.validate(params(dtype=code))
        assert status == INVALID and msg.startswith(f"dtype: got code {code}"), msg
        assert "float32, bfloat16, float16 or float64" in msg


def test_platform_and_backend_codes():
    assert _lib.select_backend(params(), _lib.PLATFORM_CPU)[:2] == ("cpu_flash", OK)
    # params() is float32, which cuDNN does not take: the CUDA flash kernels with a CUDA
    # build and a GPU, XLA's reference otherwise (this build, or no device).
    name = "cuda_flash" if _lib.built_with_cuda() and _has_gpu() else "xla_reference"
    assert _lib.select_backend(params(), _lib.PLATFORM_CUDA)[:2] == (name, OK)
    name, status, reason = _lib.select_backend(params(), 2)
    assert (name, status) == ("none", INVALID) and "platform" in reason
    names = [_lib.lib.fa_backend_name(i).decode() for i in range(8)]
    assert names == ["none", "cpu_flash", "xla_reference", "cudnn", "hopper", "cuda_flash",
                     "hopper", "unknown"]  # 4 and 6: the Hopper forward and backward


# Each field of the ctypes mirror, set to a bad value, must be reported under its own name:
# a field out of place in the mirror would be read as another one.
FIELDS = {
    "batch": (dict(batch=0), "batch: got 0"),
    "seqlen_q": (dict(seqlen_q=0), "query sequence length: got 0"),
    "seqlen_kv": (dict(seqlen_kv=(1 << 20) + 1), "key/value sequence length: got 1048577"),
    "heads_q": (dict(heads_q=3), "q has 3 heads and k/v have 2"),
    "heads_kv": (dict(heads_kv=0), "k/v heads 0"),
    "head_dim_qk": (dict(head_dim_qk=600), "head dim of q and k: got 600"),
    "head_dim_v": (dict(head_dim_v=513), "head dim of v: got 513"),
    "window_left": (dict(window_left=-5), "window_size: got (-5, -1)"),
    "window_right": (dict(window_right=-7), "window_size: got (-1, -7)"),
    "scale": (dict(scale=float("inf")), "scaling_factor: got inf"),
    "dropout": (dict(dropout=1.5), "dropout_probability: got 1.5"),
    "max_segments": (dict(max_segments=0), "max_segments_per_seq: got 0"),
    "bias_batch": (dict(bias_type=1, bias_batch=5, bias_heads=1), "batch extent 5"),
    "bias_heads": (dict(bias_type=1, bias_batch=1, bias_heads=3), "head extent 3"),
    "num_slices": (dict(num_slices=3), "num_slices: got 3"),
    # is_training has no invalid value; its neighbours' entries above would catch a shift.
}


@pytest.mark.parametrize("field", FIELDS)
def test_each_params_field_is_read_as_itself(field):
    overrides, expected = FIELDS[field]
    status, msg = _lib.validate(params(**overrides))
    assert status in (INVALID, UNIMPLEMENTED) and expected in msg, msg


def test_dropout_without_training_is_valid():
    assert _lib.validate(params(is_training=0, dropout=0.25)) == (OK, "")


def test_mask_codes_mean_the_python_masks(key):
    # Names alone cannot tell masks apart (validate never prints one): run each code on an
    # input where all six masks give different outputs, against the reference's rule for
    # the Python member of that code.
    Sq, Skv = 24, 16
    q, k, v = qkv(key, 2, Sq, Skv, 2, 1, 16)
    q_lens, kv_lens = [20, Sq], [Skv, 9]

    @jax.jit
    def run(q, k, v):
        got, ref = [], []
        for m in AttnMaskType:
            lens = (q_lens, kv_lens) if m.is_padding() else (None, None)
            sd = descriptor(*lens) if m.is_padding() else None
            got.append(fusedattn.fused_attn((q, k, v), None, sd, None, attn_mask_type=int(m)))
            ref.append(reference_f32(q, k, v, m, *lens)[0])
        return got, ref

    got, ref = run(q, k, v)
    for m, g, r in zip(AttnMaskType, got, ref):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-5,
                                   err_msg=m.name)
    for i in range(len(ref)):
        for j in range(i):
            assert not np.allclose(ref[i], ref[j], atol=1e-3), \
                f"{AttnMaskType(i).name} and {AttnMaskType(j).name} agree on this input"


def test_request_flags_match_the_engine():
    # The REQUEST_* bits Python sends as backend_flags are backend.h's kRequest* (each name
    # asked of the engine), distinct single bits; an unknown name is -1.
    names = [n for n in dir(_lib) if n.startswith("REQUEST_")]
    assert len(names) >= 10
    for n in names:
        assert _lib.request_flag(n[len("REQUEST_"):].lower()) == getattr(_lib, n), n
    bits = [getattr(_lib, n) for n in names]
    assert len(set(bits)) == len(bits) and all(b > 0 and b & (b - 1) == 0 for b in bits)
    assert _lib.request_flag("no_such_flag") == -1
