//! Branch-free f32 math for the library's loops: written without libm calls or branches, so that the loops
//! using them vectorize to the widest registers the calling function is compiled for (`#[target_feature]`).

/// `e^x` in f32 without a libm call, branch-free so that the loops using it vectorize: `x = n·ln2 + r` with
/// `|r| ≤ ln2/2`, `e^r` by its degree-6 Taylor polynomial (truncation error below 2·10⁻⁷ relative), scaled by
/// `2^n` through the exponent bits. Infinity above 88.72, 0 below -87.33 (no subnormals), NaN kept.
#[inline(always)]
pub(super) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5·2^23: adding and subtracting it rounds to the nearest integer
    let c = x.clamp(-87.0, 88.0);
    let t = c * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (c - n * LN2_HI) - n * LN2_LO;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // `n` is the integer in `t`'s low mantissa bits: 2^n's exponent field from integer arithmetic, which
    // vectorizes (a float-to-int `as` saturates lane by lane in scalar code).
    let e = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23;
    let scaled = p * f32::from_bits(e);
    let scaled = if x > 88.72 { f32::INFINITY } else { scaled };
    let scaled = if x < -87.33 { 0.0 } else { scaled };
    if x.is_nan() { x } else { scaled }
}

/// `1 / (1 + e^-x)`, the interpreter's formula.
#[inline(always)]
pub(super) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `tanh` as `1 - 2/(e^{2x} + 1)`: exactly ±1 at the ends, within a few 10⁻⁸ absolute of libm's near 0.
#[inline(always)]
pub(super) fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * x) + 1.0)
}
