//! The polynomial approximations of `exp`, `log`, `tanh`, `sigmoid` and `erf` on f32 that both emitters
//! generate: the Cranelift emitter's vector loops (`cpu::vmath`) and the NVPTX emitter (`ptx::math`, which has
//! no libdevice). One table of coefficients and ranges serves both, so their results agree.
//!
//! The coefficients of `exp` and `log` are published ones — Cephes' single-precision library (S. Moshier) —,
//! with Cody–Waite range reduction (`x = n ln2 + r`, `ln2 = LN2_HI + LN2_LO`). `tanh`'s and `erf`'s rational
//! functions are kiln's own fits. Polynomials are listed highest degree first (Horner order). Accuracy on each guarded range is documented
//! and tested in `cpu::vmath`.

// The coefficients are written as published, so they can be checked against their source.
#![allow(clippy::excessive_precision)]

/// The high part of Cody–Waite's split of ln 2 (exact in few bits).
pub(crate) const LN2_HI: f32 = 0.693_359_4;
/// The low part: `LN2_HI + LN2_LO` is ln 2 beyond f32 precision.
pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;
/// log2(e).
pub(crate) const LOG2_E: f32 = std::f32::consts::LOG2_E;

/// `exp(r) = 1 + r + r^2 P(r)` on the reduced range `|r| <= ln2 / 2`.
pub(crate) const EXP_P: [f32; 6] =
    [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5.000_000_1e-1];
/// Arguments of `exp` are clamped to this range (a NaN stays NaN): below it the result is 0, above it infinity.
/// On it `n = round(x log2 e)` lies in [-150, 129], so `2^n` is applied as two normal factors `2^(n>>1)` and
/// `2^(n - (n>>1))`, and subnormal results and overflow to infinity come out of the last multiplication.
pub(crate) const EXP_CLAMP: (f32, f32) = (-104.0, 89.0);

/// `tanh(x) ≈ x P(x^2) / Q(x^2)` for `|x| <= TANH_CLAMP`: kiln's own fit (as `erf`'s: a weighted least-squares
/// rational fit on [0, 9.02], iterated towards minimax relative error; 1.3e-9 relative in exact arithmetic, so f32
/// rounding dominates; `scripts/fit_tanh.py` reproduces it). Eleven multiply-adds and one division, no `exp`: a third
/// of what `1 - 2/(e^2x + 1)` costs.
pub(crate) const TANH_P: [f32; 6] = [-1.220_367_2e-11, 3.058_531_2e-8, 2.800_758_4e-5, 3.868_334e-3, 1.367_992e-1, 1.0];
/// See [`TANH_P`].
pub(crate) const TANH_Q: [f32; 5] = [1.287_375_2e-6, 3.938_642e-4, 2.724_586_2e-2, 4.701_325_3e-1, 1.0];
/// Arguments of `tanh` are clamped to ±this, where the rational function evaluated in f32 is at least 1 (f32
/// `tanh` is exactly ±1 from 9.011 on); the result is clamped to [-1, 1], since near 9 the function overshoots 1 by
/// up to 2 ulps.
pub(crate) const TANH_CLAMP: f32 = 9.1;

/// `erf(x) ≈ x P(x^2) / Q(x^2)` for `|x| < ERF_ONE_FROM`: kiln's own fit (a weighted least-squares rational
/// fit, iterated towards minimax relative error; 1.9e-9 relative in exact arithmetic, so f32 rounding dominates).
pub(crate) const ERF_P: [f32; 7] = [
    -1.279_737_687_004_026_2e-8,
    4.608_788_173_151_496e-6,
    3.767_419_691_868_618e-4,
    3.838_544_147_704_207_5e-3,
    5.424_351_026_675_714_6e-2,
    1.851_345_391_185_827_7e-1,
    1.128_379_169_140_116_4,
];
/// See [`ERF_P`].
pub(crate) const ERF_Q: [f32; 6] = [
    6.239_499_310_814_85e-5,
    1.301_486_291_387_817_9e-3,
    1.542_983_069_017_173_6e-2,
    1.138_731_195_482_262e-1,
    4.974_046_196_470_342e-1,
    1.0,
];
/// From this magnitude on, f32 `erf` is exactly ±1 (the smallest such f32 is 3.919206). The PTX emitter's guard.
#[cfg_attr(not(feature = "ptx"), allow(dead_code))]
pub(crate) const ERF_ONE_FROM: f32 = 3.92;
/// Where the rational `x P(x^2) / Q(x^2)` evaluated in f32 (with FMA) is exactly ±1: clamping the argument to
/// ±this saturates `erf` without a select (between [`ERF_ONE_FROM`] and here it is at most 2 ulps below 1,
/// 1.2e-7 relative).
pub(crate) const ERF_CLAMP: f32 = 4.0;

/// `log(1 + r) = r - r^2/2 + r^3 P(r)` for `r` in `[sqrt(1/2) - 1, sqrt(2) - 1)`.
pub(crate) const LOG_P: [f32; 9] = [
    7.037_683_6e-2,
    -1.151_461e-1,
    1.167_699_9e-1,
    -1.242_014_1e-1,
    1.424_932_3e-1,
    -1.666_805_8e-1,
    2.000_071_4e-1,
    -2.499_999_4e-1,
    3.333_333_1e-1,
];
