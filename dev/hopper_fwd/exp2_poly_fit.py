"""exp2_poly.patch's polynomial: fits 2^f on [-0.5, 0.5] (degree 3, p(0) = 1, relative error
near minimax by reweighted least squares) and checks the kernel's float32 steps (the 1.5 * 2^23
rounding, the exponent add) over x in [-126, 8] against 2^x in float64. Session 38: relative
error 1.02e-4 (coefficients 0.6932897, 0.24221106, 0.05497582).
    python dev/hopper_fwd/exp2_poly_fit.py
"""
import numpy as np

f = (np.cos(np.linspace(0, np.pi, 4001)) * 0.5)
y = np.exp2(f)
w = 1 / y
best = None
for _ in range(60):
    A = np.stack([f, f ** 2, f ** 3], 1) * w[:, None]
    c, *_ = np.linalg.lstsq(A, (y - 1) * w, rcond=None)
    err = (1 + f * c[0] + f ** 2 * c[1] + f ** 3 * c[2]) / y - 1
    w = w * (1 + 50 * np.abs(err) / np.abs(err).max())
    if best is None or np.abs(err).max() < best[0]:
        best = (np.abs(err).max(), c.astype(np.float32))
c = best[1]
F = np.float32


def exp2_poly(x):  # the kernel's steps in float32 (fma rounded once more here: within 1e-7)
    t = (x + F(12582912.0)).astype(F)
    fr = (x - (t - F(12582912.0)).astype(F)).astype(F)
    p = ((((c[2] * fr + c[1]).astype(F) * fr + c[0]).astype(F)) * fr + F(1)).astype(F)
    bits = p.view(np.int32) + (t.view(np.int32) << 23)
    return np.where(x < -126, F(0), bits.astype(np.int32).view(F))


xs = np.linspace(-126, 8, 2_000_001).astype(F)
rel = np.abs(exp2_poly(xs) / np.exp2(xs.astype(np.float64)) - 1).max()
print(f"coefficients {[float(v) for v in c]}; max relative error over [-126, 8]: {rel:.3g}")
with np.errstate(invalid="ignore"):  # -inf (a dropped key) gives 0
    assert exp2_poly(np.array([-np.inf], F))[0] == 0.0
