//! `lstm` and `gru` on f32: ONNX's one-layer recurrent ops (layout 0, default activations, full-length
//! sequences), with the semantics of the reference interpreter (`kiln_ir::interp`, `nn/rnn.rs`).
//!
//! Per direction, the input projections of every time step are one GEMM (`X[seq·batch, in] · Wᵀ` plus both
//! biases); each step then adds `H_{t-1} · Rᵀ` (a small GEMM over the batch) and applies the gate arithmetic
//! row by row. The GRU without `linear_before_reset` needs a second small GEMM per step, `(r ⊙ H_{t-1}) · R_hᵀ`.
//! When the weights are fixed for the program, the runtime packs `W`, `R` (and `R_h`) once at load
//! ([`RnnPacked`]); a call without them packs `R` per call when the sequence is long enough to repay it.

use kiln_ir::op::{Gru, Lstm, RnnDirection};

use super::matmul::gemm_bt;
use super::packed::{PackedB, matmul_packed_f32, prefer_packed};
use super::vmath::{sigmoid, tanh};
use super::{LibraryError, Par};

/// A direction's recurrent weight `R` (`[n, k]`, as ONNX stores it) for the per-step products `H · Rᵀ`: packed
/// once per call when the packed kernel wins for this batch (then every time step streams the packed panels
/// instead of the `gemm` crate packing `R` again per step), else read in place.
enum Recurrent<'a> {
    Packed(PackedB),
    /// Packed once at load ([`RnnPacked`]).
    Shared(&'a PackedB),
    InPlace {
        r: &'a [f32],
        n: usize,
        k: usize,
    },
}

impl<'a> Recurrent<'a> {
    /// `R` read through `shared` (packed at load) when given and the packed kernel wins for this batch.
    fn new(r: &'a [f32], n: usize, k: usize, batch: usize, seq: usize, shared: Option<&'a PackedB>) -> Recurrent<'a> {
        if let Some(p) = shared.filter(|_| prefer_packed(batch, k, n)) {
            return Recurrent::Shared(p);
        }
        if seq > 1 && prefer_packed(batch, k, n) {
            // The lengths were checked by the caller, so packing cannot fail; if it did, read in place.
            if let Ok(p) = PackedB::pack_transposed(r, k, n) {
                return Recurrent::Packed(p);
            }
        }
        Recurrent::InPlace { r, n, k }
    }

    /// `out[batch, n] = h[batch, k] · Rᵀ`.
    fn apply(&self, h: &[f32], batch: usize, out: &mut [f32]) -> Result<(), LibraryError> {
        let p = match self {
            Recurrent::Packed(p) => p,
            Recurrent::Shared(p) => *p,
            Recurrent::InPlace { r, n, k } => {
                gemm_bt(batch, *n, *k, h, *k, r, *k, out, *n, false, Par::SERIAL);
                return Ok(());
            }
        };
        matmul_packed_f32(&h[..batch * p.k()], batch, p, &mut out[..batch * p.n()], None, Par::SERIAL)
    }
}

/// A recurrent op's weights packed once for every call (the runtime builds it when it loads the weights): per
/// direction, the input weight `W_d` (`[gates·h, in]`) and the recurrent weight `R_d` (`[gates·h, h]`) as panels
/// of `B = Wᵀ` and `Rᵀ`, and for a GRU the candidate's `R_h` (the last `h` rows of `R_d`) on its own.
pub struct RnnPacked {
    gates: usize,
    hidden: usize,
    input: usize,
    dirs: Vec<DirPacked>,
}

struct DirPacked {
    w: PackedB,
    r: PackedB,
    r_h: Option<PackedB>,
}

impl RnnPacked {
    /// Packs `w` (`[dirs, gates·hidden, input]`) and `r` (`[dirs, gates·hidden, hidden]`); `gru` also packs each
    /// direction's `R_h`.
    ///
    /// Errors if the lengths disagree with the extents.
    pub fn pack(
        w: &[f32],
        r: &[f32],
        gates: usize,
        hidden: usize,
        input: usize,
        gru: bool,
    ) -> Result<RnnPacked, LibraryError> {
        let rows = gates.checked_mul(hidden).ok_or_else(|| LibraryError::shape("rnn", "gates × hidden overflows"))?;
        let (wd, rd) = (rows.saturating_mul(input), rows.saturating_mul(hidden));
        if wd == 0
            || rd == 0
            || !w.len().is_multiple_of(wd)
            || !r.len().is_multiple_of(rd)
            || w.len() / wd != r.len() / rd
        {
            return Err(LibraryError::shape(
                "rnn",
                format!(
                    "weights of {} and {} elements do not fit {gates} gates of {hidden} from {input}",
                    w.len(),
                    r.len()
                ),
            ));
        }
        let dirs = (0..w.len() / wd)
            .map(|d| {
                let r_d = &r[d * rd..(d + 1) * rd];
                Ok(DirPacked {
                    w: PackedB::pack_transposed(&w[d * wd..(d + 1) * wd], input, rows)?,
                    r: PackedB::pack_transposed(r_d, hidden, rows)?,
                    r_h: if gru {
                        Some(PackedB::pack_transposed(&r_d[2 * hidden * hidden..], hidden, hidden)?)
                    } else {
                        None
                    },
                })
            })
            .collect::<Result<_, LibraryError>>()?;
        Ok(RnnPacked { gates, hidden, input, dirs })
    }

    /// Direction `d`'s packed weights, if they were packed for these extents (else the call reads in place).
    fn direction(&self, s: &RnnShape, gates: usize, d: usize) -> Option<&DirPacked> {
        (self.gates == gates && self.hidden == s.hidden && self.input == s.input && self.dirs.len() == s.dirs)
            .then(|| &self.dirs[d])
    }
}

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
    y: usize,
    states: &[usize],
) -> Result<(), LibraryError> {
    if y != s.seq * s.dirs * s.batch * s.hidden {
        return Err(LibraryError::shape(
            op,
            format!("y has {y} elements, the shapes need {}", s.seq * s.dirs * s.batch * s.hidden),
        ));
    }
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
    packed: Option<&PackedB>,
    par: Par,
) -> Result<Vec<f32>, LibraryError> {
    let rows = gates * s.hidden;
    let wd = &w[d * rows * s.input..(d + 1) * rows * s.input];
    let m = s.seq * s.batch;
    let mut xw = vec![0.0f32; m * rows];
    match packed.filter(|_| prefer_packed(m, s.input, rows)) {
        Some(p) => matmul_packed_f32(&x[..m * s.input], m, p, &mut xw, None, par)?,
        None => gemm_bt(m, rows, s.input, x, s.input, wd, s.input, &mut xw, rows, false, par),
    }
    let (wb, rb) = (&b[d * 2 * rows..d * 2 * rows + rows], &b[d * 2 * rows + rows..(d + 1) * 2 * rows]);
    let bias: Vec<f32> = (0..rows).map(|g| wb[g] + if g < fold_rb * s.hidden { rb[g] } else { 0.0 }).collect();
    for row in xw.chunks_exact_mut(rows) {
        for (v, b) in row.iter_mut().zip(&bias) {
            *v += b;
        }
    }
    Ok(xw)
}

/// The clamp of the pre-activations (`f32::INFINITY` for none); NaN stays NaN.
#[inline(always)]
fn clamp(v: f32, clip: f32) -> f32 {
    let v = if v > clip { clip } else { v };
    if v < -clip { -clip } else { v }
}

/// One LSTM row's cell update in place: `g` holds the four gates' summed pre-activations (`i, o, f, c̃`, `h`
/// each); `c` and `h` the state. Straight-line loops over the hidden units, so they vectorize.
#[inline(always)]
fn lstm_row(g: &mut [f32], c: &mut [f32], h: &mut [f32], clip: f32, input_forget: bool) {
    let hs = c.len();
    for v in g.iter_mut() {
        *v = clamp(*v, clip);
    }
    let (ifo, cand) = g.split_at_mut(3 * hs);
    for v in ifo.iter_mut() {
        *v = sigmoid(*v);
    }
    for v in cand.iter_mut() {
        *v = tanh(*v);
    }
    let (i, rest) = ifo.split_at(hs);
    let (o, f) = rest.split_at(hs);
    if input_forget {
        for j in 0..hs {
            c[j] = (1.0 - i[j]) * c[j] + i[j] * cand[j];
        }
    } else {
        for j in 0..hs {
            c[j] = f[j] * c[j] + i[j] * cand[j];
        }
    }
    for j in 0..hs {
        h[j] = o[j] * tanh(c[j]);
    }
}

/// One GRU row's update in place: `zr` holds the z and r gates' summed pre-activations, `cand` the candidate's
/// pre-activation without its recurrent term, `rec` that term's input (`h·R_hᵀ` with `linear_before_reset`, else
/// `(r⊙h)·R_hᵀ` already computed), `rb_h` its bias.
#[inline(always)]
fn gru_row(zr: &mut [f32], cand: &mut [f32], rec: &[f32], rb_h: &[f32], h: &mut [f32], clip: f32, lbr: bool) {
    let hs = h.len();
    for v in zr.iter_mut() {
        *v = sigmoid(clamp(*v, clip));
    }
    let (z, r) = zr.split_at(hs);
    // Separate loops per variant: a branch inside keeps the loop scalar.
    if lbr {
        for j in 0..hs {
            cand[j] += r[j] * (rec[j] + rb_h[j]);
        }
    } else {
        for j in 0..hs {
            cand[j] += rec[j] + rb_h[j];
        }
    }
    for v in cand.iter_mut() {
        *v = tanh(clamp(*v, clip));
    }
    for j in 0..hs {
        h[j] = (1.0 - z[j]) * cand[j] + z[j] * h[j];
    }
}

widest_vectors! {
    /// `lstm_row` compiled for the best vector width this CPU has (AVX-512, AVX2 + FMA, or the baseline).
    fn lstm_row_dispatch(g: &mut [f32], c: &mut [f32], h: &mut [f32], clip: f32, input_forget: bool) = lstm_row, lstm_row;
}

widest_vectors! {
    /// `gru_row` compiled for the best vector width this CPU has.
    fn gru_row_dispatch(
        zr: &mut [f32],
        cand: &mut [f32],
        rec: &[f32],
        rb_h: &[f32],
        h: &mut [f32],
        clip: f32,
        lbr: bool,
    ) = gru_row, gru_row;
}

/// The pre-activation bound of `clip` (infinity for none).
fn clip_bound(op: &'static str, clip: f64) -> Result<f32, LibraryError> {
    if clip.is_finite() && clip < 0.0 {
        return Err(LibraryError::shape(op, format!("clip {clip} must not be negative")));
    }
    Ok(if clip.is_finite() { clip as f32 } else { f32::INFINITY })
}

/// LSTM: `y[seq, dirs, batch, h]`, `y_h` and `y_c[dirs, batch, h]` from `x`, `w`, `r`, `b`, `h0`, `c0`; `packed`
/// holds `w` and `r` packed at load (used when its extents match).
#[allow(clippy::too_many_arguments)]
pub fn lstm_f32(
    l: &Lstm,
    s: &RnnShape,
    packed: Option<&RnnPacked>,
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
    check("lstm", s, 4, x.len(), w.len(), r.len(), b.len(), y.len(), &[h0.len(), c0.len(), y_h.len(), y_c.len()])?;
    let clip = clip_bound("lstm", l.clip)?;
    let (hs, rows) = (s.hidden, 4 * s.hidden);
    y_h.copy_from_slice(h0);
    y_c.copy_from_slice(c0);
    let mut hr = vec![0.0f32; s.batch * rows];
    for d in 0..s.dirs {
        let pd = packed.and_then(|p| p.direction(s, 4, d));
        let xw = project(x, w, b, s, 4, d, 4, pd.map(|p| &p.w), par)?;
        let rd = Recurrent::new(&r[d * rows * hs..(d + 1) * rows * hs], rows, hs, s.batch, s.seq, pd.map(|p| &p.r));
        let state = d * s.batch * hs..(d + 1) * s.batch * hs;
        for step in 0..s.seq {
            let t = if s.reverse(l.direction, d) { s.seq - 1 - step } else { step };
            rd.apply(&y_h[state.clone()], s.batch, &mut hr)?;
            for n in 0..s.batch {
                let g = &mut hr[n * rows..(n + 1) * rows];
                for (v, p) in g.iter_mut().zip(&xw[(t * s.batch + n) * rows..(t * s.batch + n + 1) * rows]) {
                    *v += p;
                }
                let at = state.start + n * hs;
                lstm_row_dispatch(g, &mut y_c[at..at + hs], &mut y_h[at..at + hs], clip, l.input_forget);
                let out = ((t * s.dirs + d) * s.batch + n) * hs;
                y[out..out + hs].copy_from_slice(&y_h[at..at + hs]);
            }
        }
    }
    Ok(())
}

/// GRU: `y[seq, dirs, batch, h]` and `y_h[dirs, batch, h]` from `x`, `w`, `r`, `b`, `h0`; `packed` holds `w` and
/// `r` packed at load (used when its extents match).
#[allow(clippy::too_many_arguments)]
pub fn gru_f32(
    g: &Gru,
    s: &RnnShape,
    packed: Option<&RnnPacked>,
    x: &[f32],
    w: &[f32],
    r: &[f32],
    b: &[f32],
    h0: &[f32],
    y: &mut [f32],
    y_h: &mut [f32],
    par: Par,
) -> Result<(), LibraryError> {
    check("gru", s, 3, x.len(), w.len(), r.len(), b.len(), y.len(), &[h0.len(), y_h.len()])?;
    let clip = clip_bound("gru", g.clip)?;
    let (hs, rows) = (s.hidden, 3 * s.hidden);
    y_h.copy_from_slice(h0);
    let mut hr = vec![0.0f32; s.batch * rows];
    let mut gated = vec![0.0f32; s.batch * hs];
    let mut rec = vec![0.0f32; s.batch * hs];
    let mut zr = vec![0.0f32; 2 * hs];
    let mut cand = vec![0.0f32; hs];
    for d in 0..s.dirs {
        // z and r take both biases with the projection; the candidate's recurrent bias goes with its own term.
        let pd = packed.and_then(|p| p.direction(s, 3, d));
        let xw = project(x, w, b, s, 3, d, 2, pd.map(|p| &p.w), par)?;
        let r_d = &r[d * rows * hs..(d + 1) * rows * hs];
        let rd = Recurrent::new(r_d, rows, hs, s.batch, s.seq, pd.map(|p| &p.r));
        // R_h alone (`[h, h]`, rows 2h.. of R), for the candidate's recurrent GEMM without `linear_before_reset`.
        let rh_seq = if g.linear_before_reset { 1 } else { s.seq };
        let rh = Recurrent::new(&r_d[2 * hs * hs..], hs, hs, s.batch, rh_seq, pd.and_then(|p| p.r_h.as_ref()));
        let rb_h = &b[d * 2 * rows + rows + 2 * hs..d * 2 * rows + 2 * rows];
        let state = d * s.batch * hs..(d + 1) * s.batch * hs;
        for step in 0..s.seq {
            let t = if s.reverse(g.direction, d) { s.seq - 1 - step } else { step };
            rd.apply(&y_h[state.clone()], s.batch, &mut hr)?;
            if g.linear_before_reset {
                for n in 0..s.batch {
                    rec[n * hs..(n + 1) * hs].copy_from_slice(&hr[n * rows + 2 * hs..(n + 1) * rows]);
                }
            } else {
                // The candidate's recurrent term needs r first: (r ⊙ h)·R_hᵀ.
                for n in 0..s.batch {
                    let pre = &xw[(t * s.batch + n) * rows..];
                    let (hrow, h) = (&hr[n * rows..], &y_h[state.start + n * hs..]);
                    for j in 0..hs {
                        gated[n * hs + j] = sigmoid(clamp(pre[hs + j] + hrow[hs + j], clip)) * h[j];
                    }
                }
                rh.apply(&gated, s.batch, &mut rec)?;
            }
            for n in 0..s.batch {
                let pre = &xw[(t * s.batch + n) * rows..(t * s.batch + n + 1) * rows];
                for (k, v) in zr.iter_mut().enumerate() {
                    *v = pre[k] + hr[n * rows + k];
                }
                cand.copy_from_slice(&pre[2 * hs..]);
                let at = state.start + n * hs;
                let h = &mut y_h[at..at + hs];
                gru_row_dispatch(&mut zr, &mut cand, &rec[n * hs..(n + 1) * hs], rb_h, h, clip, g.linear_before_reset);
                let out = ((t * s.dirs + d) * s.batch + n) * hs;
                y[out..out + hs].copy_from_slice(h);
            }
        }
    }
    Ok(())
}
