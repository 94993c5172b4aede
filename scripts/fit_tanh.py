#!/usr/bin/env python3
"""Reproduces the rational approximation of tanh that both kiln emitters use (`TANH_P`, `TANH_Q` in
codegen/src/approx.rs): tanh(x) ~ x P(x^2) / Q(x^2) on [0, 9.02], P of degree 5 and Q of degree 4 in x^2, Q(0) = 1.

The fit is linearized least squares on the relative error, reweighted towards minimax (Lawson's iteration:
each round multiplies a point's weight by a power of its error), in float64 over a dense grid plus a geometric
grid near 0; the variable is scaled to [0, 1] for conditioning and the coefficients scaled back. It prints the
coefficients rounded to f32, highest degree first (Horner order, as approx.rs lists them), the exact-arithmetic
relative error, and the error of an f32 evaluation with fused multiply-adds (the argument clamped to 9.1 and the
result to [-1, 1], as the emitters do).

    .venv/bin/python scripts/fit_tanh.py
"""

import numpy as np

FIT_TO = 9.02  # f32 tanh is exactly 1 from 9.011 on
CLAMP = 9.1  # where the f32 evaluation reaches 1
DP, DQ = 5, 4


def fit(iters=300):
    x = np.sort(np.concatenate([np.linspace(1e-5, FIT_TO, 40000), np.geomspace(1e-7, 1, 4000)]))
    z, t = x * x, np.tanh(x)
    u = z / (FIT_TO * FIT_TO)
    a = np.concatenate([x[:, None] * u[:, None] ** np.arange(DP + 1), -(t[:, None] * u[:, None] ** np.arange(1, DQ + 1))], axis=1)
    w, lawson, best = 1.0 / t, np.ones_like(x), None
    for _ in range(iters):
        weight = w * lawson
        sol, *_ = np.linalg.lstsq(a * weight[:, None], t * weight, rcond=None)
        p, q = sol[: DP + 1], np.concatenate([[1.0], sol[DP + 1 :]])
        qu = np.polyval(q[::-1], u)
        err = np.abs(x * np.polyval(p[::-1], u) / qu - t) / t
        if best is None or err.max() < best[0]:
            best = (err.max(), p.copy(), q.copy())
        w = 1.0 / (t * qu)
        lawson = lawson * (err / err.max()) ** 0.3 + 1e-12
        lawson /= lawson.max()
    m, p, q = best
    scale = FIT_TO * FIT_TO
    return m, p / scale ** np.arange(DP + 1), q / scale ** np.arange(DQ + 1)


def eval_f32(x, p, q):
    """The emitters' evaluation in f32, each Horner step one fused multiply-add."""
    f = np.float32
    x = np.clip(x.astype(f), f(-CLAMP), f(CLAMP)).astype(f)
    z = (x * x).astype(f)

    def horner(c):
        acc = np.full_like(z, f(c[-1]))
        for k in c[-2::-1]:
            acc = (acc.astype(np.float64) * z + np.float64(f(k))).astype(f)
        return acc

    y = ((x * horner(p)).astype(f) / horner(q)).astype(f)
    return np.clip(y, -1, 1)


def main():
    m, p, q = fit()
    print("TANH_P", [str(np.float32(c)) for c in p[::-1]])
    print("TANH_Q", [str(np.float32(c)) for c in q[::-1]])
    print(f"relative error in exact arithmetic: {m:.2e}")
    xs = np.concatenate([np.linspace(-10, 10, 400001), (np.arange(1000) - 500) * 1.3e-3]).astype(np.float32)
    want = np.tanh(xs.astype(np.float64))
    got = eval_f32(xs, p, q).astype(np.float64)
    rel = np.where(want == 0, 0.0, np.abs(got - want) / np.maximum(np.abs(want), 1e-300))
    print(f"relative error of the f32 evaluation: {rel.max():.2e}; at +-{CLAMP}: {eval_f32(np.float32([CLAMP, -CLAMP]), p, q)}")


if __name__ == "__main__":
    main()
