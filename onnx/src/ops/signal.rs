//! Signal-processing ONNX ops as compositions of IR primitives: DFT (opsets 17–20), STFT and MelWeightMatrix.
//!
//! A DFT over a signal axis of static length is two products with constant matrices — `cos` and `sin` of the
//! twiddle angles, `[n, K]`, computed in f64 and rounded to the compute type (f64 for f64 signals, else f32,
//! the result rounded once to the input's dtype) — so no FFT routine is needed and the products run as the library's GEMM: for the frame lengths
//! of audio front ends (hundreds of samples) a matrix product is as fast as an FFT and exactly as general
//! (truncation and zero-padding to `dft_length` are rows of the matrix). Forward, inverse (`1/L`) and the
//! one-sided forms follow ONNX's reference (`numpy.fft.fft`, `ifft`, `irfft`). STFT frames the signal with one
//! gather of constant indices, weights the frames by the window, and transforms them along the frame axis.
//! MelWeightMatrix is a constant.

use kiln_ir::op::{BinaryOp as B, Concat, Gather};
use kiln_ir::{DType, Dim, Op, Tensor};

use super::{bin, cast, const_ints, onnx_dtype, reshape, transpose};
use crate::import::{Ctx, Val};
use crate::node::OnnxNode;

/// The most elements a constant twiddle matrix may hold.
const MAX_TWIDDLES: usize = 1 << 26;

/// One known scalar integer input (`what` names it), or `None` when absent.
fn scalar_int(n: &OnnxNode<'_>, i: usize, what: &str) -> Result<Option<i64>, String> {
    match const_ints(n, i, what)?.as_deref() {
        None => Ok(None),
        Some(&[v]) => Ok(Some(v)),
        Some(v) => Err(format!("`{what}` must be one integer, got {v:?}")),
    }
}

/// DFT: opset 17 and 19 take `axis` as an attribute (default 1), opset 20 as the third input (default -2); the
/// last dim holds the real part, or the real and imaginary parts.
pub(crate) fn dft(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let rank = x.ty.shape.rank();
    let axis = if n.opset >= 20 { scalar_int(n, 2, "axis")?.unwrap_or(-2) } else { n.int("axis", 1) };
    let axis = if axis < 0 { axis + rank as i64 } else { axis };
    if rank < 2 || !(0..rank as i64 - 1).contains(&axis) {
        return Err(format!("axis {axis} is not a signal axis of {} (the last dim holds the parts)", x.ty.shape));
    }
    let inverse = n.int("inverse", 0) != 0;
    let onesided = n.int("onesided", 0) != 0;
    let len = x.ty.shape.0[axis as usize]
        .as_static()
        .ok_or_else(|| format!("a DFT along the symbolic extent `{}` is not supported", x.ty.shape.0[axis as usize]))?;
    let default = if inverse && onesided { 2 * len.saturating_sub(1) } else { len };
    let length = match scalar_int(n, 1, "dft_length")? {
        Some(l) if l > 0 => l as u64,
        Some(l) => return Err(format!("dft_length {l} must be positive")),
        None => default,
    };
    Ok(vec![transform(cx, x, axis as usize, length, inverse, onesided)?])
}

/// The DFT of `x` (`[…, parts]`, parts 1 or 2) along `axis`, over `length` points: a complex result `[…, K, …, 2]`,
/// or for the inverse one-sided transform the real signal `[…, length, …, 1]`.
fn transform(
    cx: &mut Ctx<'_>,
    x: &Val,
    axis: usize,
    length: u64,
    inverse: bool,
    onesided: bool,
) -> Result<Val, String> {
    let dtype = x.dtype();
    if !dtype.is_float() {
        return Err(format!("a DFT of {dtype} is not supported (float types only)"));
    }
    let d = x.ty.shape.0.clone();
    let rank = d.len();
    let parts = match d[rank - 1].as_static() {
        Some(p @ (1 | 2)) => p,
        _ => return Err(format!("the last dim of {} must be 1 (real) or 2 (complex)", x.ty.shape)),
    };
    let n = d[axis].as_static().ok_or("a DFT needs a static signal extent")? as usize;
    let length = length as usize;
    // f32 arithmetic (the library's GEMM) for every float type but f64; twiddles are computed in f64 and rounded.
    let compute = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
    let x = cast(cx, x, compute)?;
    // The parts, each without the last dim, with the signal axis moved last.
    let mut perm: Vec<i64> = (0..rank as i64 - 1).filter(|&a| a != axis as i64).collect();
    perm.push(axis as i64);
    let mut inverse_perm = vec![0i64; rank - 1];
    for (i, &p) in perm.iter().enumerate() {
        inverse_perm[p as usize] = i as i64;
    }
    let part = |cx: &mut Ctx<'_>, i: i64| -> Result<Val, String> {
        let index = cx.constant(Tensor::from_vec(vec![], vec![i]).map_err(|e| e.to_string())?)?;
        let p = cx.op(Op::Gather(Gather { axis: rank as i64 - 1 }), &[&x, &index])?;
        transpose(cx, &p, perm.clone())
    };
    let re = part(cx, 0)?;
    let im = if parts == 2 { Some(part(cx, 1)?) } else { None };
    let real_out = inverse && onesided;
    let bins = if real_out || !onesided { length } else { length / 2 + 1 };
    if n.checked_mul(bins).is_none_or(|e| e > MAX_TWIDDLES) {
        return Err(format!("a DFT of {n} points into {bins} bins needs too large a matrix"));
    }
    // Twiddle matrices [n, bins]: row j is input sample (or bin) j; rows past `length` (or past the half spectrum
    // an inverse one-sided transform reads) are zero: truncation.
    let (mut cos, mut sin) = (vec![0.0f64; n * bins], vec![0.0f64; n * bins]);
    let rows = if real_out { n.min(length / 2 + 1) } else { n.min(length) };
    let tau = 2.0 * std::f64::consts::PI / length as f64;
    for j in 0..rows {
        // The one-sided inverse counts each bin strictly inside the half spectrum twice (its mirror image).
        let weight = match (real_out, j) {
            (false, _) => 1.0,
            (true, 0) => 1.0,
            (true, j) if 2 * j == length => 1.0,
            (true, _) => 2.0,
        };
        let scale = if inverse { weight / length as f64 } else { 1.0 };
        for k in 0..bins {
            let angle = tau * ((j * k) % length) as f64;
            cos[j * bins + k] = scale * angle.cos();
            // e^{-iθ} forward, e^{+iθ} inverse; the real inverse keeps -Im·sin.
            sin[j * bins + k] = if inverse && !real_out { scale * angle.sin() } else { -scale * angle.sin() };
        }
    }
    let matrix = |cx: &mut Ctx<'_>, v: Vec<f64>| -> Result<Val, String> {
        let data = kiln_ir::Data::from_f64_iter(compute, v.into_iter());
        cx.constant(Tensor::new(vec![n, bins], data).map_err(|e| e.to_string())?)
    };
    let (c, s) = (matrix(cx, cos)?, matrix(cx, sin)?);
    let product = |cx: &mut Ctx<'_>, a: &Val, m: &Val| cx.op(Op::MatMul, &[a, m]);
    let back = |cx: &mut Ctx<'_>, v: &Val| -> Result<Val, String> {
        let v = transpose(cx, v, inverse_perm.clone())?;
        let mut dims = v.ty.shape.0.clone();
        dims.push(Dim::Static(1));
        reshape(cx, &v, dims)
    };
    let result = if real_out {
        // y = Re·C' + Im·S' (the imaginary parts of the DC and Nyquist bins drop out: their sines vanish).
        let mut y = product(cx, &re, &c)?;
        if let Some(im) = &im {
            let t = product(cx, im, &s)?;
            y = bin(cx, B::Add, &y, &t)?;
        }
        back(cx, &y)?
    } else {
        // (re + i·im)(C + i·S) = re·C - im·S + i(re·S + im·C).
        let (mut yr, mut yi) = (product(cx, &re, &c)?, product(cx, &re, &s)?);
        if let Some(im) = &im {
            let (a, b) = (product(cx, im, &s)?, product(cx, im, &c)?);
            yr = bin(cx, B::Sub, &yr, &a)?;
            yi = bin(cx, B::Add, &yi, &b)?;
        }
        let (yr, yi) = (back(cx, &yr)?, back(cx, &yi)?);
        cx.op(Op::Concat(Concat { axis: rank as i64 - 1 }), &[&yr, &yi])?
    };
    cast(cx, &result, dtype)
}

/// STFT (opset 17): frames of `frame_length` samples every `frame_step` along the signal `[batch, len, parts]`,
/// each weighted by `window` (ones by default) and transformed: `[batch, frames, bins, 2]`, one-sided by default.
pub(crate) fn stft(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let x = n.input(0)?;
    let d = x.ty.shape.0.clone();
    if d.len() != 3 {
        return Err(format!("the signal must be [batch, length, 1 or 2], got {}", x.ty.shape));
    }
    let len =
        d[1].as_static().ok_or_else(|| format!("an STFT over the symbolic length `{}` is not supported", d[1]))?;
    let step = scalar_int(n, 1, "frame_step")?.ok_or("needs `frame_step`")?;
    let window = n.opt_input(2).filter(|w| w.ty.shape.num_elements() != Some(0));
    let frame = match (scalar_int(n, 3, "frame_length")?, window) {
        (Some(f), _) => f,
        (None, Some(w)) if w.ty.shape.rank() == 1 => {
            w.ty.shape.0[0].as_static().ok_or("the window must have a static length")? as i64
        }
        (None, Some(w)) => return Err(format!("the window must be one-dimensional, got {}", w.ty.shape)),
        (None, None) => len as i64,
    };
    if step <= 0 || frame <= 0 || frame as u64 > len {
        return Err(format!("frame_step {step} and frame_length {frame} must be positive, the frame within {len}"));
    }
    let (step, frame) = (step as u64, frame as u64);
    let frames = 1 + (len - frame) / step;
    if frames.checked_mul(frame).is_none_or(|e| e > MAX_TWIDDLES as u64) {
        return Err(format!("{frames} frames of {frame} samples are too many"));
    }
    let indices: Vec<i64> = (0..frames).flat_map(|f| (0..frame).map(move |t| (f * step + t) as i64)).collect();
    let indices =
        cx.constant(Tensor::from_vec(vec![frames as usize, frame as usize], indices).map_err(|e| e.to_string())?)?;
    // [batch, frames, frame, parts]
    let mut framed = cx.op(Op::Gather(Gather { axis: 1 }), &[x, &indices])?;
    if let Some(w) = window {
        if w.ty.shape.0 != [Dim::Static(frame)] {
            return Err(format!("the window {} must hold frame_length {frame} values", w.ty.shape));
        }
        let w = cast(cx, w, x.dtype())?;
        let w = reshape(cx, &w, vec![Dim::Static(1), Dim::Static(1), Dim::Static(frame), Dim::Static(1)])?;
        framed = bin(cx, B::Mul, &framed, &w)?;
    }
    let onesided = n.int("onesided", 1) != 0;
    Ok(vec![transform(cx, &framed, 2, frame, false, onesided)?])
}

/// MelWeightMatrix (opset 17): the `[dft_length/2 + 1, num_mel_bins]` triangular filter bank of ONNX's reference,
/// a constant (every input must be known at import).
pub(crate) fn mel_weight_matrix(cx: &mut Ctx<'_>, n: &OnnxNode<'_>) -> Result<Vec<Val>, String> {
    let mels = scalar_int(n, 0, "num_mel_bins")?.ok_or("needs `num_mel_bins`")?;
    let dft_length = scalar_int(n, 1, "dft_length")?.ok_or("needs `dft_length`")?;
    let rate = scalar_int(n, 2, "sample_rate")?.ok_or("needs `sample_rate`")?;
    let edge = |i: usize, what: &str| -> Result<f32, String> {
        match n.input(i)?.floats().as_deref() {
            Some(&[v]) => Ok(v as f32),
            _ => Err(format!("input `{what}` must be known at import time (one value)")),
        }
    };
    let (lower, upper) = (edge(3, "lower_edge_hertz")?, edge(4, "upper_edge_hertz")?);
    if mels <= 0 || dft_length <= 0 || rate <= 0 {
        return Err(format!("num_mel_bins {mels}, dft_length {dft_length} and sample_rate {rate} must be positive"));
    }
    // The filter bank is a constant of the model: bounded like the other constants a handler builds.
    if (dft_length as u64 / 2 + 1).checked_mul(mels as u64).is_none_or(|e| e > MAX_TWIDDLES as u64) {
        return Err(format!("a filter bank of {mels} bands over a {dft_length}-point spectrum is too large"));
    }
    let dtype = onnx_dtype(n.int("output_datatype", 1))?;
    if !dtype.is_float() {
        return Err(format!("output_datatype {dtype} is not supported (float types only)"));
    }
    let (mels, spectrum) = (mels as usize, dft_length as usize / 2 + 1);
    // As the reference computes them: the edges' mel values from f32 logarithms, the rest in f64.
    let mel = |hz: f32| f64::from(2595.0f32 * (hz / 700.0).ln_1p()) / std::f64::consts::LN_10;
    let (low, high) = (mel(lower), mel(upper));
    let step = (high - low) / (mels + 2) as f64;
    let bins: Vec<i64> = (0..mels + 2)
        .map(|i| {
            let hz = 700.0 * ((i as f64 * step + low) / 2595.0 * std::f64::consts::LN_10).exp_m1();
            ((dft_length + 1) as f64 * hz / rate as f64).floor() as i64
        })
        .collect();
    let mut out = vec![0.0f64; spectrum * mels];
    let mut set = |j: i64, i: usize, v: f64| -> Result<(), String> {
        let j = usize::try_from(j).ok().filter(|&j| j < spectrum).ok_or_else(|| {
            format!("a mel band's edge (bin {j}) lies outside the {spectrum} spectrum bins: check the edge frequencies")
        })?;
        out[j * mels + i] = v;
        Ok(())
    };
    for i in 0..mels {
        let (lo, centre, hi) = (bins[i], bins[i + 1], bins[i + 2]);
        if centre == lo {
            set(centre, i, 1.0)?;
        } else {
            for j in lo..=centre {
                set(j, i, (j - lo) as f64 / (centre - lo) as f64)?;
            }
        }
        for j in centre..hi {
            set(j, i, (hi - j) as f64 / (hi - centre) as f64)?;
        }
    }
    let t = Tensor::new(vec![spectrum, mels], kiln_ir::Data::from_f64_iter(dtype, out.into_iter()))
        .map_err(|e| e.to_string())?;
    Ok(vec![cx.constant(t)?])
}
