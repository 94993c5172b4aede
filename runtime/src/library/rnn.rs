//! `lstm` and `gru` on f32: ONNX's one-layer recurrent ops (layout 0, default activations, full-length
//! sequences), with the semantics of the reference interpreter (`kiln_ir::interp`, `nn/rnn.rs`).
//!
//! Per direction, the input projections of every time step are one GEMM (`X[seq·batch, in] · Wᵀ` plus both
//! biases); each step then adds `H_{t-1} · Rᵀ` (a small GEMM over the batch) and applies the gate arithmetic
//! row by row. The GRU without `linear_before_reset` needs a second small GEMM per step, `(r ⊙ H_{t-1}) · R_hᵀ`.

use kiln_ir::op::{Gru, Lstm, RnnDirection};

use super::matmul::gemm_rowmajor;
use super::{LibraryError, Par};

/// Extents of a recurrent call.
#[derive(Copy, Clone, Debug)]
pub struct RnnShape {
    /// Time steps.
    pub seq: usize,
    /// Batch rows.
    pub batch: usize,
    /// Input features.
    pub input: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Directions (1, or 2 for bidirectional).
    pub dirs: usize,
}

impl RnnShape {
    /// The extents of `x[seq, batch, input]` with this hidden size and direction.
    pub fn new(x: &[usize], hidden: i64, direction: RnnDirection) -> Result<RnnShape, LibraryError> {
        let [seq, batch, input] = x[..] else {
            return Err(LibraryError::shape("rnn", format!("x must have rank 3, got {x:?}")));
        };
        let hidden = usize::try_from(hidden).map_err(|_| LibraryError::shape("rnn", "negative hidden_size"))?;
        let dirs = if direction == RnnDirection::Bidirectional { 2 } else { 1 };
        Ok(RnnShape { seq, batch, input, hidden, dirs })
    }

    /// Direction `d`'s time steps in the order it visits them.
    fn reverse(&self, direction: RnnDirection, d: usize) -> bool {
        direction == RnnDirection::Reverse || d == 1
    }
}

/// The operand lengths a call with `gates` gates needs, checked against the slices.
fn check(
    op: &'static str,
    s: &RnnShape,
    gates: usize,
    x: usize,
    w: usize,
    r: usize,
    b: usize,
    states: &[usize],
) -> Result<(), LibraryError> {
    let rows = gates * s.hidden;
    let want = [
        ("x", s.seq * s.batch * s.input, x),
        ("w", s.dirs * rows * s.input, w),
        ("r", s.dirs * rows * s.hidden, r),
        ("b", s.dirs * 2 * rows, b),
    ];
    for (what, n, got) in want {
        if n != got {
            return Err(LibraryError::shape(op, format!("{what} has {got} elements, the shapes need {n}")));
        }
    }
    for &got in states {
        if got != s.dirs * s.batch * s.hidden {
            return Err(LibraryError::shape(
                op,
                format!("a state has {got} elements, the shapes need {}", s.dirs * s.batch * s.hidden),
            ));
        }
    }
    Ok(())
}

/// `m[rows, cols]` (row-major) transposed into `[cols, rows]`.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; rows * cols];
    for i in 0..rows {
        for j in 0..cols {
            t[j * rows + i] = m[i * cols + j];
        }
    }
    t
}

/// Direction `d`'s input projections for every step: `X · W_dᵀ + Wb_d + Rb_d` as `[seq·batch, gates·h]`, with
/// `Rb` folded in only for the gates whose recurrent bias adds plainly (`fold_rb` of them, from the first).
fn project(
    x: &[f32],
    w: &[f32],
    b: &[f32],
    s: &RnnShape,
    gates: usize,
    d: usize,
    fold_rb: usize,
    par: Par,
) -> Vec<f32> {
    let rows = gates * s.hidden;
    let wt = transpose(&w[d * rows * s.input..(d + 1) * rows * s.input], rows, s.input);
    let m = s.seq * s.batch;
    let mut xw = vec![0.0f32; m * rows];
    gemm_rowmajor(m, rows, s.input, x, s.input, &wt, rows, &mut xw, rows, false, par);
    let (wb, rb) = (&b[d * 2 * rows..d * 2 * rows + rows], &b[d * 2 * rows + rows..(d + 1) * 2 * rows]);
    let bias: Vec<f32> = (0..rows).map(|g| wb[g] + if g < fold_rb * s.hidden { rb[g] } else { 0.0 }).collect();
    for row in xw.chunks_exact_mut(rows) {
        for (v, b) in row.iter_mut().zip(&bias) {
            *v += b;
        }
    }
    xw
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Clamps a pre-activation into `[-clip, clip]` when `clip` is finite (NaN stays NaN).
fn clipper(clip: f64) -> Result<impl Fn(f32) -> f32 + Copy, LibraryError> {
    if clip.is_finite() && clip < 0.0 {
        return Err(LibraryError::shape("rnn", format!("clip {clip} must not be negative")));
    }
    let c = if clip.is_finite() { clip as f32 } else { f32::INFINITY };
    Ok(move |v: f32| {
        if v > c {
            c
        } else if v < -c {
            -c
        } else {
            v
        }
    })
}

/// LSTM: `y[seq, dirs, batch, h]`, `y_h` and `y_c[dirs, batch, h]` from `x`, `w`, `r`, `b`, `h0`, `c0`.
#[allow(clippy::too_many_arguments)]
pub fn lstm_f32(
    l: &Lstm,
    s: &RnnShape,
    x: &[f32],
    w: &[f32],
    r: &[f32],
    b: &[f32],
    h0: &[f32],
    c0: &[f32],
    y: &mut [f32],
    y_h: &mut [f32],
    y_c: &mut [f32],
    par: Par,
) -> Result<(), LibraryError> {
    check("lstm", s, 4, x.len(), w.len(), r.len(), b.len(), &[h0.len(), c0.len(), y_h.len(), y_c.len()])?;
    if y.len() != s.seq * s.dirs * s.batch * s.hidden {
        return Err(LibraryError::shape("lstm", "y has the wrong length"));
    }
    let clip = clipper(l.clip)?;
    let (hs, rows) = (s.hidden, 4 * s.hidden);
    y_h.copy_from_slice(h0);
    y_c.copy_from_slice(c0);
    let mut hr = vec![0.0f32; s.batch * rows];
    for d in 0..s.dirs {
        let xw = project(x, w, b, s, 4, d, 4, par);
        let rt = transpose(&r[d * rows * hs..(d + 1) * rows * hs], rows, hs);
        let state = d * s.batch * hs..(d + 1) * s.batch * hs;
        for step in 0..s.seq {
            let t = if s.reverse(l.direction, d) { s.seq - 1 - step } else { step };
            gemm_rowmajor(s.batch, rows, hs, &y_h[state.clone()], hs, &rt, rows, &mut hr, rows, false, Par::SERIAL);
            for n in 0..s.batch {
                let pre = &xw[(t * s.batch + n) * rows..(t * s.batch + n + 1) * rows];
                let rec = &hr[n * rows..(n + 1) * rows];
                let at = state.start + n * hs;
                let (h, c) = (&mut y_h[at..at + hs], &mut y_c[at..at + hs]);
                for j in 0..hs {
                    let g = |k: usize| clip(pre[k * hs + j] + rec[k * hs + j]);
                    let i = sigmoid(g(0));
                    let o = sigmoid(g(1));
                    let f = if l.input_forget { 1.0 - i } else { sigmoid(g(2)) };
                    let cell = f * c[j] + i * g(3).tanh();
                    c[j] = cell;
                    h[j] = o * cell.tanh();
                }
                let out = ((t * s.dirs + d) * s.batch + n) * hs;
                y[out..out + hs].copy_from_slice(h);
            }
        }
    }
    Ok(())
}

/// GRU: `y[seq, dirs, batch, h]` and `y_h[dirs, batch, h]` from `x`, `w`, `r`, `b`, `h0`.
#[allow(clippy::too_many_arguments)]
pub fn gru_f32(
    g: &Gru,
    s: &RnnShape,
    x: &[f32],
    w: &[f32],
    r: &[f32],
    b: &[f32],
    h0: &[f32],
    y: &mut [f32],
    y_h: &mut [f32],
    par: Par,
) -> Result<(), LibraryError> {
    check("gru", s, 3, x.len(), w.len(), r.len(), b.len(), &[h0.len(), y_h.len()])?;
    if y.len() != s.seq * s.dirs * s.batch * s.hidden {
        return Err(LibraryError::shape("gru", "y has the wrong length"));
    }
    let clip = clipper(g.clip)?;
    let (hs, rows) = (s.hidden, 3 * s.hidden);
    y_h.copy_from_slice(h0);
    let mut hr = vec![0.0f32; s.batch * rows];
    let mut gated = vec![0.0f32; s.batch * hs];
    let mut cand = vec![0.0f32; s.batch * hs];
    for d in 0..s.dirs {
        // z and r take both biases with the projection; the candidate's recurrent bias goes with its own term.
        let xw = project(x, w, b, s, 3, d, 2, par);
        let rt = transpose(&r[d * rows * hs..(d + 1) * rows * hs], rows, hs);
        // R_hᵀ alone (`[h, h]`), for the candidate's recurrent GEMM without `linear_before_reset`.
        let rht: Vec<f32> = (0..hs).flat_map(|k| rt[k * rows + 2 * hs..k * rows + 3 * hs].to_vec()).collect();
        let rb_h = &b[d * 2 * rows + rows + 2 * hs..d * 2 * rows + 2 * rows];
        let state = d * s.batch * hs..(d + 1) * s.batch * hs;
        for step in 0..s.seq {
            let t = if s.reverse(g.direction, d) { s.seq - 1 - step } else { step };
            gemm_rowmajor(s.batch, rows, hs, &y_h[state.clone()], hs, &rt, rows, &mut hr, rows, false, Par::SERIAL);
            if !g.linear_before_reset {
                for n in 0..s.batch {
                    let pre = &xw[(t * s.batch + n) * rows..];
                    let (rec, h) = (&hr[n * rows..], &y_h[state.start + n * hs..]);
                    for j in 0..hs {
                        let reset = sigmoid(clip(pre[hs + j] + rec[hs + j]));
                        gated[n * hs + j] = reset * h[j];
                    }
                }
                gemm_rowmajor(s.batch, hs, hs, &gated, hs, &rht, hs, &mut cand, hs, false, Par::SERIAL);
            }
            for n in 0..s.batch {
                let pre = &xw[(t * s.batch + n) * rows..(t * s.batch + n + 1) * rows];
                let rec = &hr[n * rows..(n + 1) * rows];
                let at = state.start + n * hs;
                let h = &mut y_h[at..at + hs];
                for j in 0..hs {
                    let z = sigmoid(clip(pre[j] + rec[j]));
                    let recurrent = if g.linear_before_reset {
                        let reset = sigmoid(clip(pre[hs + j] + rec[hs + j]));
                        reset * (rec[2 * hs + j] + rb_h[j])
                    } else {
                        cand[n * hs + j] + rb_h[j]
                    };
                    let candidate = clip(pre[2 * hs + j] + recurrent).tanh();
                    h[j] = (1.0 - z) * candidate + z * h[j];
                }
                let out = ((t * s.dirs + d) * s.batch + n) * hs;
                y[out..out + hs].copy_from_slice(h);
            }
        }
    }
    Ok(())
}
