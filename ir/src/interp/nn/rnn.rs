//! `lstm` and `gru`: ONNX's one-layer recurrent ops, layout 0, default activations, every sequence full length.
//!
//! Per direction `d` and step `t` (walked backwards for the reverse direction, which still writes `y[t]`), each
//! gate's pre-activation is `x_t·Wᵀ + Wb + h_{t-1}·Rᵀ + Rb`; with a finite `clip` every pre-activation is clamped
//! into `[-clip, clip]` before its activation (as ONNX Runtime does; the cell state itself is not clipped).
//!
//! LSTM, gates `i, o, f, c` in that order: `i, o, f = σ(·)` (with `input_forget`, `f = 1 - i`), `c̃ = tanh(·)`,
//! `C_t = f⊙C_{t-1} + i⊙c̃`, `H_t = o⊙tanh(C_t)`.
//!
//! GRU, gates `z, r, h`: `z, r = σ(·)`; `h̃ = tanh(x_t·W_hᵀ + Wb_h + (r⊙h_{t-1})·R_hᵀ + Rb_h)`, or with
//! `linear_before_reset` `tanh(x_t·W_hᵀ + Wb_h + r⊙(h_{t-1}·R_hᵀ + Rb_h))`; `H_t = (1-z)⊙h̃ + z⊙H_{t-1}`.

use super::{load, store, with_real};
use crate::interp::num::Real;
use crate::op::{Gru, Lstm, RnnDirection};
use crate::tensor::Tensor;

/// `lstm(x, w, r, b, h0, c0)` → `y, y_h, y_c`.
pub(super) fn lstm(l: &Lstm, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let [x, w, r, b, h0, c0] = inputs else {
        return Err(format!("takes 6 operands, got {}", inputs.len()));
    };
    let dims = RnnDims::new(x, l.hidden_size, l.direction, 4);
    let clip = clip_bound(l.clip)?;
    with_real!(x.dtype(), F => {
        let weights = RnnWeights::<F>::load(w, r, b);
        let xv = load::<F>(x);
        let (mut h, mut c) = (load::<F>(h0), load::<F>(c0));
        let mut y = vec![F::ZERO; dims.seq * dims.dirs * dims.batch * dims.hidden];
        let hs = dims.hidden;
        for d in 0..dims.dirs {
            for t in dims.steps(d) {
                for n in 0..dims.batch {
                    let state = (d * dims.batch + n) * hs;
                    let (xw, hr) = weights.project(&dims, d, &xv[(t * dims.batch + n) * dims.input..], &h[state..]);
                    let pre = |g: usize, j: usize| clip.apply(xw[g * hs + j] + hr[g * hs + j]);
                    for j in 0..hs {
                        let i = sigmoid(pre(0, j));
                        let o = sigmoid(pre(1, j));
                        let f = if l.input_forget { F::ONE - i } else { sigmoid(pre(2, j)) };
                        let cell = f * c[state + j] + i * pre(3, j).tanh();
                        c[state + j] = cell;
                        h[state + j] = o * cell.tanh();
                    }
                    let at = ((t * dims.dirs + d) * dims.batch + n) * hs;
                    y[at..at + hs].copy_from_slice(&h[state..state + hs]);
                }
            }
        }
        let state_shape = [dims.dirs, dims.batch, hs];
        Ok(vec![store(x.dtype(), &dims.y_shape(), y)?, store(x.dtype(), &state_shape, h)?, {
            store(x.dtype(), &state_shape, c)?
        }])
    })
}

/// `gru(x, w, r, b, h0)` → `y, y_h`.
pub(super) fn gru(g: &Gru, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let [x, w, r, b, h0] = inputs else {
        return Err(format!("takes 5 operands, got {}", inputs.len()));
    };
    let dims = RnnDims::new(x, g.hidden_size, g.direction, 3);
    let clip = clip_bound(g.clip)?;
    with_real!(x.dtype(), F => {
        let weights = RnnWeights::<F>::load(w, r, b);
        let xv = load::<F>(x);
        let mut h = load::<F>(h0);
        let mut y = vec![F::ZERO; dims.seq * dims.dirs * dims.batch * dims.hidden];
        let hs = dims.hidden;
        for d in 0..dims.dirs {
            for t in dims.steps(d) {
                for n in 0..dims.batch {
                    let state = (d * dims.batch + n) * hs;
                    let prev = h[state..state + hs].to_vec();
                    let (xw, hr) = weights.project(&dims, d, &xv[(t * dims.batch + n) * dims.input..], &prev);
                    let z: Vec<F> = (0..hs).map(|j| sigmoid(clip.apply(xw[j] + hr[j]))).collect();
                    let reset: Vec<F> = (0..hs).map(|j| sigmoid(clip.apply(xw[hs + j] + hr[hs + j]))).collect();
                    // The candidate's recurrent term: R_h·(r⊙h) + Rb_h, or r⊙(R_h·h + Rb_h).
                    let recurrent: Vec<F> = if g.linear_before_reset {
                        (0..hs).map(|j| reset[j] * hr[2 * hs + j]).collect()
                    } else {
                        let gated: Vec<F> = (0..hs).map(|j| reset[j] * prev[j]).collect();
                        weights.recurrent_gate(&dims, d, 2, &gated)
                    };
                    for j in 0..hs {
                        let cand = clip.apply(xw[2 * hs + j] + recurrent[j]).tanh();
                        h[state + j] = (F::ONE - z[j]) * cand + z[j] * prev[j];
                    }
                    let at = ((t * dims.dirs + d) * dims.batch + n) * hs;
                    y[at..at + hs].copy_from_slice(&h[state..state + hs]);
                }
            }
        }
        Ok(vec![store(x.dtype(), &dims.y_shape(), y)?, store(x.dtype(), &[dims.dirs, dims.batch, hs], h)?])
    })
}

/// Extents of a recurrent op, all checked against one another by the type rule.
struct RnnDims {
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    dirs: usize,
    /// Gates per direction (LSTM 4, GRU 3).
    gates: usize,
    direction: RnnDirection,
}

impl RnnDims {
    fn new(x: &Tensor, hidden: i64, direction: RnnDirection, gates: usize) -> RnnDims {
        let s = x.shape();
        let dirs = if direction == RnnDirection::Bidirectional { 2 } else { 1 };
        RnnDims { seq: s[0], batch: s[1], input: s[2], hidden: hidden.max(0) as usize, dirs, gates, direction }
    }

    /// The time steps direction `d` visits, in order.
    fn steps(&self, d: usize) -> Box<dyn Iterator<Item = usize>> {
        let reverse = self.direction == RnnDirection::Reverse || d == 1;
        if reverse { Box::new((0..self.seq).rev()) } else { Box::new(0..self.seq) }
    }

    fn y_shape(&self) -> [usize; 4] {
        [self.seq, self.dirs, self.batch, self.hidden]
    }
}

/// `w[dirs, gates·h, input]`, `r[dirs, gates·h, h]`, `b[dirs, 2·gates·h]` in the compute type.
struct RnnWeights<F> {
    w: Vec<F>,
    r: Vec<F>,
    b: Vec<F>,
}

impl<F: Real> RnnWeights<F> {
    fn load(w: &Tensor, r: &Tensor, b: &Tensor) -> RnnWeights<F> {
        RnnWeights { w: load(w), r: load(r), b: load(b) }
    }

    /// For direction `d`, one batch row's `x_t·Wᵀ + Wb` and `h·Rᵀ + Rb`, each of `gates·h` entries.
    fn project(&self, dims: &RnnDims, d: usize, x: &[F], h: &[F]) -> (Vec<F>, Vec<F>) {
        let rows = dims.gates * dims.hidden;
        let wb = &self.b[d * 2 * rows..];
        let xw = (0..rows)
            .map(|g| {
                let row = &self.w[(d * rows + g) * dims.input..];
                let mut acc = F::ZERO;
                for k in 0..dims.input {
                    acc = acc + x[k] * row[k];
                }
                acc + wb[g]
            })
            .collect();
        let hr = (0..dims.gates).flat_map(|gate| self.recurrent_gate(dims, d, gate, h)).collect();
        (xw, hr)
    }

    /// For direction `d`, gate `gate`'s `v·R_gateᵀ + Rb_gate` (`h` entries).
    fn recurrent_gate(&self, dims: &RnnDims, d: usize, gate: usize, v: &[F]) -> Vec<F> {
        let (hs, rows) = (dims.hidden, dims.gates * dims.hidden);
        let rb = &self.b[d * 2 * rows + rows..];
        (0..hs)
            .map(|j| {
                let g = gate * hs + j;
                let row = &self.r[(d * rows + g) * hs..];
                let mut acc = F::ZERO;
                for k in 0..hs {
                    acc = acc + v[k] * row[k];
                }
                acc + rb[g]
            })
            .collect()
    }
}

/// `1 / (1 + e^-x)`: exactly 0 for very negative `x` (the exponential overflows to infinity), 1 for very positive.
fn sigmoid<F: Real>(x: F) -> F {
    F::ONE / (F::ONE + (-x).exp())
}

/// The clamp applied to pre-activations: none unless `clip` is finite.
#[derive(Copy, Clone)]
struct Clip(Option<f64>);

fn clip_bound(clip: f64) -> Result<Clip, String> {
    if clip.is_finite() && clip < 0.0 {
        return Err(format!("clip {clip} must not be negative"));
    }
    Ok(Clip(clip.is_finite().then_some(clip)))
}

impl Clip {
    /// Clamps into `[-clip, clip]`; NaN stays NaN.
    fn apply<F: Real>(self, v: F) -> F {
        match self.0 {
            Some(c) if v > F::of_f64(c) => F::of_f64(c),
            Some(c) if v < F::of_f64(-c) => F::of_f64(-c),
            _ => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use crate::op::{Gru, Lstm, Op, RnnDirection};

    fn lstm(direction: RnnDirection, clip: f64, input_forget: bool) -> Op {
        Op::Lstm(Lstm { hidden_size: 1, direction, clip, input_forget })
    }

    fn gru(direction: RnnDirection, clip: f64, linear_before_reset: bool) -> Op {
        Op::Gru(Gru { hidden_size: 1, direction, clip, linear_before_reset })
    }

    /// Hidden 1, input 1, batch 1, x = [1, 2]; weights per gate (i, o, f, c) and initial h, c.
    struct LstmDir {
        w: [f64; 4],
        r: [f64; 4],
        b: [f64; 8],
        h0: f64,
        c0: f64,
    }

    const LSTM_A: LstmDir = LstmDir {
        w: [0.5, 0.6, 0.7, 0.8],
        r: [0.1, 0.2, 0.3, 0.4],
        b: [0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08],
        h0: 0.1,
        c0: 0.2,
    };

    const LSTM_B: LstmDir = LstmDir {
        w: [-0.5, 0.4, -0.3, 0.2],
        r: [0.3, -0.2, 0.1, -0.4],
        b: [0.0, 0.1, 0.0, 0.1, 0.1, 0.0, 0.1, 0.0],
        h0: -0.1,
        c0: 0.3,
    };

    fn lstm_inputs(dirs: &[&LstmDir]) -> Vec<crate::tensor::Tensor> {
        let n = dirs.len();
        let cat = |f: &dyn Fn(&LstmDir) -> Vec<f64>| dirs.iter().flat_map(|d| f(d)).collect::<Vec<_>>();
        vec![
            f64s(&[2, 1, 1], &[1.0, 2.0]),
            f64s(&[n, 4, 1], &cat(&|d| d.w.to_vec())),
            f64s(&[n, 4, 1], &cat(&|d| d.r.to_vec())),
            f64s(&[n, 8], &cat(&|d| d.b.to_vec())),
            f64s(&[n, 1, 1], &cat(&|d| vec![d.h0])),
            f64s(&[n, 1, 1], &cat(&|d| vec![d.c0])),
        ]
    }

    // Two hand-unrolled steps of the equations in the module docs, evaluated in double precision. For LSTM_A
    // forward, step 1: i = σ(0.5 + 0.01 + 0.1·0.1 + 0.05) = σ(0.57), f = σ(0.81), o = σ(0.70), c̃ = tanh(0.96),
    // C = σ(0.81)·0.2 + σ(0.57)·tanh(0.96) = 0.61469, H = σ(0.70)·tanh(C) = 0.36578.
    const A_FWD: [(f64, f64); 2] = [(0.3657783015699781, 0.6146876409506474), (0.668822357096215, 1.2268450186246083)];
    const A_REV: [(f64, f64); 2] = [(0.5496375022670569, 0.8661860958670659), (0.5637766040967614, 1.155787298816417)];
    const B_REV: [(f64, f64); 2] =
        [(0.17649533077800958, 0.2520365373864873), (0.12588265104185617, 0.2079229981074914)];
    const A_CLIP: [(f64, f64); 2] =
        [(0.24293907265419268, 0.41214100288533884), (0.3088351874561456, 0.5441901496618375)];
    const A_COUPLED: [(f64, f64); 2] =
        [(0.3332702750161953, 0.5476640199561122), (0.5486512283466656, 0.8505571292777219)];

    #[test]
    fn lstm_matches_hand_unrolled_steps() {
        use RnnDirection::*;
        check(
            &[
                Case {
                    name: "forward",
                    op: lstm(Forward, f64::INFINITY, false),
                    inputs: lstm_inputs(&[&LSTM_A]),
                    want: vec![
                        (vec![2, 1, 1, 1], vec![A_FWD[0].0, A_FWD[1].0]),
                        (vec![1, 1, 1], vec![A_FWD[1].0]),
                        (vec![1, 1, 1], vec![A_FWD[1].1]),
                    ],
                },
                Case {
                    name: "reverse writes y at the original time index",
                    op: lstm(Reverse, f64::INFINITY, false),
                    inputs: lstm_inputs(&[&LSTM_A]),
                    want: vec![
                        (vec![2, 1, 1, 1], vec![A_REV[1].0, A_REV[0].0]),
                        (vec![1, 1, 1], vec![A_REV[1].0]),
                        (vec![1, 1, 1], vec![A_REV[1].1]),
                    ],
                },
                Case {
                    name: "bidirectional stacks forward then reverse",
                    op: lstm(Bidirectional, f64::INFINITY, false),
                    inputs: lstm_inputs(&[&LSTM_A, &LSTM_B]),
                    want: vec![
                        (vec![2, 2, 1, 1], vec![A_FWD[0].0, B_REV[1].0, A_FWD[1].0, B_REV[0].0]),
                        (vec![2, 1, 1], vec![A_FWD[1].0, B_REV[1].0]),
                        (vec![2, 1, 1], vec![A_FWD[1].1, B_REV[1].1]),
                    ],
                },
                Case {
                    name: "clip 0.5 bounds every pre-activation",
                    op: lstm(Forward, 0.5, false),
                    inputs: lstm_inputs(&[&LSTM_A]),
                    want: vec![
                        (vec![2, 1, 1, 1], vec![A_CLIP[0].0, A_CLIP[1].0]),
                        (vec![1, 1, 1], vec![A_CLIP[1].0]),
                        (vec![1, 1, 1], vec![A_CLIP[1].1]),
                    ],
                },
                Case {
                    name: "input_forget couples f = 1 - i",
                    op: lstm(Forward, f64::INFINITY, true),
                    inputs: lstm_inputs(&[&LSTM_A]),
                    want: vec![
                        (vec![2, 1, 1, 1], vec![A_COUPLED[0].0, A_COUPLED[1].0]),
                        (vec![1, 1, 1], vec![A_COUPLED[1].0]),
                        (vec![1, 1, 1], vec![A_COUPLED[1].1]),
                    ],
                },
            ],
            1e-14,
        );
    }

    #[test]
    fn lstm_handles_empty_batch_and_sequence() {
        let op = lstm(RnnDirection::Forward, f64::INFINITY, false);
        let weights = |seq: usize, batch: usize| {
            vec![
                f32s(&[seq, batch, 2], &vec![0.5; seq * batch * 2]),
                f32s(&[1, 4, 2], &[0.1; 8]),
                f32s(&[1, 4, 1], &[0.1; 4]),
                f32s(&[1, 8], &[0.0; 8]),
                f32s(&[1, batch, 1], &vec![0.25; batch]),
                f32s(&[1, batch, 1], &vec![0.75; batch]),
            ]
        };
        check(
            &[
                Case {
                    name: "empty batch",
                    op: op.clone(),
                    inputs: weights(3, 0),
                    want: vec![(vec![3, 1, 0, 1], vec![]), (vec![1, 0, 1], vec![]), (vec![1, 0, 1], vec![])],
                },
                Case {
                    name: "empty sequence returns the initial state",
                    op,
                    inputs: weights(0, 2),
                    want: vec![
                        (vec![0, 1, 2, 1], vec![]),
                        (vec![1, 2, 1], vec![0.25; 2]),
                        (vec![1, 2, 1], vec![0.75; 2]),
                    ],
                },
            ],
            0.0,
        );
    }

    /// Hidden 1, input 1, batch 1, x = [1, 2], h0 = 0.5; weights per gate (z, r, h).
    fn gru_inputs() -> Vec<crate::tensor::Tensor> {
        vec![
            f64s(&[2, 1, 1], &[1.0, 2.0]),
            f64s(&[1, 3, 1], &[0.5, -0.6, 0.7]),
            f64s(&[1, 3, 1], &[0.2, 0.3, -0.4]),
            f64s(&[1, 6], &[0.01, 0.02, 0.03, 0.04, 0.05, 0.06]),
            f64s(&[1, 1, 1], &[0.5]),
        ]
    }

    #[test]
    fn gru_matches_hand_unrolled_steps() {
        use RnnDirection::*;
        // Step 1 of the default form: z = σ(0.5 + 0.01 + 0.2·0.5 + 0.04) = σ(0.65), r = σ(-0.38),
        // h̃ = tanh(0.7 + 0.03 - 0.4·(r·0.5) + 0.06), H = (1 - z)·h̃ + z·0.5 = 0.53770.
        let fwd = [0.5376972441410883, 0.6223768011271791];
        let lbr = [0.5298548523279125, 0.6143472800218117];
        let rev = [0.5944574512169063, 0.5960427834288122];
        let clipped = [0.4111915205817491, 0.36017615415051263];
        let case = |name, op, y: [f64; 2], y_h: f64| Case {
            name,
            op,
            inputs: gru_inputs(),
            want: vec![(vec![2, 1, 1, 1], y.to_vec()), (vec![1, 1, 1], vec![y_h])],
        };
        check(
            &[
                case("forward", gru(Forward, f64::INFINITY, false), fwd, fwd[1]),
                case("linear_before_reset", gru(Forward, f64::INFINITY, true), lbr, lbr[1]),
                case("reverse", gru(Reverse, f64::INFINITY, false), [rev[1], rev[0]], rev[1]),
                case("clip 0.3", gru(Forward, 0.3, false), clipped, clipped[1]),
            ],
            1e-14,
        );
    }

    #[test]
    fn gru_handles_an_empty_batch() {
        let inputs = vec![
            f32s(&[2, 0, 1], &[]),
            f32s(&[1, 3, 1], &[0.5; 3]),
            f32s(&[1, 3, 1], &[0.5; 3]),
            f32s(&[1, 6], &[0.0; 6]),
            f32s(&[1, 0, 1], &[]),
        ];
        let op = gru(RnnDirection::Reverse, f64::INFINITY, true);
        let want = vec![(vec![2, 1, 0, 1], vec![]), (vec![1, 0, 1], vec![])];
        check(&[Case { name: "empty batch", op, inputs, want }], 0.0);
    }

    #[test]
    fn gru_bidirectional_runs_each_direction_on_its_own_weights() {
        let mut inputs = gru_inputs();
        // Both directions get the same weights, so each half must match the one-direction results.
        let doubled = |t: &crate::tensor::Tensor| {
            let mut shape = t.shape().to_vec();
            shape[0] = 2;
            let v = t.to_f64_vec();
            f64s(&shape, &[v.clone(), v].concat())
        };
        for t in inputs.iter_mut().skip(1) {
            *t = doubled(t);
        }
        let (fwd, rev) = ([0.5376972441410883, 0.6223768011271791], [0.5944574512169063, 0.5960427834288122]);
        check(
            &[Case {
                name: "bidirectional",
                op: gru(RnnDirection::Bidirectional, f64::INFINITY, false),
                inputs,
                want: vec![
                    (vec![2, 2, 1, 1], vec![fwd[0], rev[1], fwd[1], rev[0]]),
                    (vec![2, 1, 1], vec![fwd[1], rev[1]]),
                ],
            }],
            1e-14,
        );
    }

    #[test]
    fn bad_rnn_operands_are_errors() {
        let op = gru(RnnDirection::Forward, -1.0, false);
        expect_err("negative clip", &op, &gru_inputs(), "clip");
        let mut inputs = gru_inputs();
        inputs[2] = f64s(&[1, 3, 2], &[0.0; 6]);
        expect_err("r of the wrong shape", &gru(RnnDirection::Forward, f64::INFINITY, false), &inputs, "r must be");
        let op = lstm(RnnDirection::Bidirectional, f64::INFINITY, false);
        expect_err("one direction of weights", &op, &lstm_inputs(&[&LSTM_A]), "must be");
    }
}
