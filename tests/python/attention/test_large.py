"""Scores of more than 2^31 (here 2^35) elements in one call on the CPU engine, cheaply:
the engine never materializes scores, and a narrow sliding window leaves each query a few
dozen keys, so the work is small while every index (batch x heads x Sq x Skv, row ranges,
tiles, lse) runs past 2^32. A few rows of out, lse and dq are checked against a float64
reference computed on the keys each row keeps. (The GPU twin with > 2^31 elements in
q/k/v is test_large_gpu.py; tests/cpp/attention/test_large.cc checks the index
arithmetic and each 32-bit limit without allocating.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import normal
from fusedattn import AttnMaskType

B, HQ, HKV, S, D = 2, 4, 2, 1 << 16, 8  # scores B * HQ * S * S = 2^35
ROWS = [0, 1, 63, 64, 4095, 32767, 32768, 50001, S - 2, S - 1]


def _window_rows(q, k, v, do, scale, window, b, h, causal):
    """out, lse and dq of query rows ROWS of (b, h), in float64 over the keys each keeps."""
    left, right = window
    hk = h // (HQ // HKV)
    outs, lses, dqs = [], [], []
    for i in ROWS:
        lo, hi = max(0, i - left), (i + 1 if causal else min(S, i + right + 1))
        qi = np.asarray(q[b, i, h], np.float64)
        kk = np.asarray(k[b, lo:hi, hk], np.float64)
        vv = np.asarray(v[b, lo:hi, hk], np.float64)
        s = kk @ qi * scale
        m = s.max()
        p = np.exp(s - m)
        lse = m + np.log(p.sum())
        p /= p.sum()
        o = p @ vv
        dp = vv @ np.asarray(do[b, i, h], np.float64)
        ds = p * (dp - (p * dp).sum())
        outs.append(o)
        lses.append(lse)
        dqs.append(scale * ds @ kk)
    return np.array(outs), np.array(lses), np.array(dqs)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "two_sided"])
def test_scores_past_2e32_elements(key, causal):
    ks = jax.random.split(key, 4)
    q, k, v = normal(ks[0], (B, S, HQ, D)), normal(ks[1], (B, S, HKV, D)), normal(ks[2], (B, S, HKV, D))
    do = normal(ks[3], (B, S, HQ, D))
    window = (40, 0) if causal else (24, 17)
    scale = 0.35
    kw = dict(attn_mask_type=AttnMaskType.CAUSAL_MASK if causal else AttnMaskType.NO_MASK,
              window_size=window, scaling_factor=scale)

    def f(q):
        out, aux = fusedattn.fused_attn((q, k, v), None, None, None, return_aux=True, **kw)
        return out, aux["softmax_aux"]

    (out, lse), vjp = jax.vjp(f, q)
    dq, = vjp((do, jnp.zeros_like(lse)))
    for b in (0, B - 1):
        for h in (0, HQ - 1):
            ref_o, ref_lse, ref_dq = _window_rows(q, k, v, do, scale, window, b, h, causal)
            rows = np.array(ROWS)
            np.testing.assert_allclose(np.asarray(out[b, rows, h]), ref_o, rtol=2e-5, atol=2e-5)
            np.testing.assert_allclose(np.asarray(lse[b, h, rows, 0]), ref_lse, rtol=2e-5,
                                       atol=2e-5)
            np.testing.assert_allclose(np.asarray(dq[b, rows, h]), ref_dq, rtol=1e-4, atol=1e-4)
