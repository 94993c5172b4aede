//! Data movement as index rewriting: reshape, transpose, slice, pad, concat, split and shape_of.
//!
//! None of these computes anything: each maps the index its consumer asks for onto its operand's index.
//! Where a position may fall outside the operand (pad's border, concat's other operands), the operand is read at
//! a clamped index and a select picks the right value, so every load stays in bounds (the IR's promise to
//! emitters). Reshape matches a common prefix and suffix of equal dims and drops unit dims, so only the dims it
//! really regroups are linearized and split again; the simplifier then removes what ranges make redundant.

use kiln_ir::interp::scalar::Scalar;
use kiln_ir::op::{BinaryOp, CoordMode, NearestMode, Pad, PadMode, Resize, Slice, Split};
use kiln_ir::types::normalize_axis;
use kiln_ir::{DType, Dim, NodeId, Shape, Tensor, Value};

use super::super::ir::{ArgId, CmpOp, Expr, IExpr};
use super::{Ctx, LowerError};

impl Ctx<'_> {
    /// Same elements in a new shape: `idx` indexes `to`.
    pub(super) fn reshape(&mut self, x: Value, idx: &[IExpr], to: &Shape) -> Result<Expr, LowerError> {
        let from = self.shape(x)?;
        let (f, t) = (&from.0, &to.0);
        let mut own: Vec<Option<IExpr>> = vec![None; f.len()];
        // Equal leading and trailing dims map straight through.
        let mut pre = 0;
        while pre < f.len() && pre < t.len() && f[pre] == t[pre] {
            own[pre] = Some(idx[pre].clone());
            pre += 1;
        }
        let mut suf = 0;
        while suf < f.len() - pre && suf < t.len() - pre && f[f.len() - 1 - suf] == t[t.len() - 1 - suf] {
            own[f.len() - 1 - suf] = Some(idx[t.len() - 1 - suf].clone());
            suf += 1;
        }
        // The middle: linearize the result's index (unit dims contribute nothing), then split it over the
        // operand's dims, last fastest.
        let mut flat = IExpr::Const(0);
        for d in pre..t.len() - suf {
            if t[d] != Dim::Static(1) {
                let n = self.dim(&t[d]);
                flat = IExpr::plus(IExpr::times(flat, n), idx[d].clone());
            }
        }
        let flat = self.simp(flat);
        let mut stride = IExpr::Const(1);
        for d in (pre..f.len() - suf).rev() {
            own[d] = Some(if f[d] == Dim::Static(1) {
                IExpr::Const(0)
            } else {
                let n = self.dim(&f[d]);
                let e = IExpr::modulo(IExpr::floor_div(flat.clone(), stride.clone()), n.clone());
                stride = IExpr::times(stride, n);
                e
            });
        }
        let own: Vec<IExpr> = own.into_iter().map(|e| e.expect("every operand dim is mapped")).collect();
        self.value_at(x, &own)
    }

    /// `out[i] = x[i permuted]`: `out.shape[k] = x.shape[perm[k]]`.
    pub(super) fn transpose(&mut self, x: Value, perm: &[i64], idx: &[IExpr]) -> Result<Expr, LowerError> {
        let mut own = vec![IExpr::Const(0); idx.len()];
        for (k, &p) in perm.iter().enumerate() {
            own[p as usize] = idx[k].clone();
        }
        self.value_at(x, &own)
    }

    /// ONNX slice: per sliced axis, `x[start + i*step]`.
    pub(super) fn slice(&mut self, id: NodeId, x: Value, s: &Slice, idx: &[IExpr]) -> Result<Expr, LowerError> {
        let shape = self.shape(x)?;
        let mut own = idx.to_vec();
        for i in 0..s.axes.len() {
            let axis = normalize_axis(s.axes[i], shape.rank()).map_err(|m| self.node_err(id, m))?;
            if shape.0[axis].as_static().is_none() {
                // A slice of a symbolic extent starts at a non-negative start, in bounds (`infer::symbolic_slice`).
                if let Some(Err(m)) = kiln_ir::infer::symbolic_slice(&shape.0[axis], s.starts[i], s.ends[i], s.steps[i])
                {
                    return Err(self.node_err(id, m));
                }
                let at = IExpr::times(idx[axis].clone(), IExpr::Const(s.steps[i]));
                own[axis] = IExpr::plus(IExpr::Const(s.starts[i]), at);
                continue;
            }
            let n = self.static_extent(id, &shape, axis, "slice")?;
            let (start, step, _) = kiln_ir::infer::slice_range(s.starts[i], s.ends[i], s.steps[i], n);
            own[axis] = IExpr::plus(IExpr::Const(start), IExpr::times(idx[axis].clone(), IExpr::Const(step)));
        }
        self.value_at(x, &own)
    }

    /// Nearest resize: each output index maps to the input index ONNX's coordinate and nearest modes pick. For a
    /// resized dim whose scale or its inverse is an integer with the asymmetric or half-pixel coordinate modes
    /// (upsampling by 2, downsampling by 2: the coordinates are then exact in floating point too, so the
    /// interpreter agrees) it is computed in exact integer arithmetic, on any extent; for any other scale or
    /// coordinate mode on static extents it is read from a constant table of the interpreter's own indices
    /// ([`kiln_ir::interp::nearest_taps`]); anything else (a symbolic extent at such a scale) is refused (and
    /// falls back).
    pub(super) fn resize_nearest(
        &mut self,
        id: NodeId,
        x: Value,
        r: &Resize,
        out_shape: &Shape,
        idx: &[IExpr],
    ) -> Result<Expr, LowerError> {
        let shape = self.shape(x)?;
        let mut own = Vec::with_capacity(idx.len());
        for d in 0..idx.len() {
            if shape.0[d] == out_shape.0[d] && r.keeps_dim(d) {
                own.push(idx[d].clone());
                continue;
            }
            let (a, b) = match self.rational_coord(id, r, d, idx[d].clone(), "resize") {
                Ok(ab) => ab,
                // Any other scale or coordinate mode on static extents: the interpreter's own indices, tabled.
                Err(e) => match (shape.0[d].as_static(), out_shape.0[d].as_static()) {
                    (Some(n), Some(m)) if n > 0 && m <= MAX_TAP_TABLE => {
                        let (n, m) = (n as usize, m as usize);
                        let taps = kiln_ir::interp::nearest_taps(r, d, n, m);
                        let t = Tensor::from_vec(vec![m], taps.into_iter().map(|i| i as i64).collect())
                            .expect("one index per output index");
                        let table = self.table(x, t);
                        own.push(IExpr::read(table, idx[d].clone()));
                        continue;
                    }
                    _ => return Err(e),
                },
            };
            let i = match r.nearest {
                NearestMode::Floor => IExpr::floor_div(a, IExpr::Const(b)),
                NearestMode::Ceil => IExpr::floor_div(IExpr::plus(a, IExpr::Const(b - 1)), IExpr::Const(b)),
                // ceil(x − 1/2) = floor((2a + b − 1) / 2b); floor(x + 1/2) = floor((2a + b) / 2b)
                NearestMode::RoundPreferFloor => IExpr::floor_div(
                    IExpr::plus(IExpr::times(a, IExpr::Const(2)), IExpr::Const(b - 1)),
                    IExpr::Const(2 * b),
                ),
                NearestMode::RoundPreferCeil => IExpr::floor_div(
                    IExpr::plus(IExpr::times(a, IExpr::Const(2)), IExpr::Const(b)),
                    IExpr::Const(2 * b),
                ),
            };
            let n = self.dim(&shape.0[d].clone());
            let last = self.simp(IExpr::minus(n, IExpr::Const(1)));
            own.push(self.simp(IExpr::max(IExpr::min(i, last), IExpr::Const(0))));
        }
        self.value_at(x, &own)
    }

    /// The input coordinate of output index `o` along dim `d` as an exact fraction `a/b` (`b > 0`): for an integer
    /// scale or its inverse with asymmetric or half-pixel coordinates; anything else is refused, naming `what`.
    fn rational_coord(
        &self,
        id: NodeId,
        r: &Resize,
        d: usize,
        o: IExpr,
        what: &str,
    ) -> Result<(IExpr, i64), LowerError> {
        let scale = r.scales[d];
        let whole = |v: f64| (v >= 1.0 && (v - v.round()).abs() < 1e-9).then(|| v.round() as i64);
        let (p, q) = match (whole(scale), whole(1.0 / scale)) {
            (Some(k), _) => (k, 1),
            (None, Some(k)) => (1, k),
            _ => {
                let why = format!("{what} by scale {scale} is not compiled (only integer scales or their inverses)");
                return Err(self.node_err(id, why));
            }
        };
        match r.coord {
            // o / (p/q) = o·q / p
            CoordMode::Asymmetric => Ok((IExpr::times(o, IExpr::Const(q)), p)),
            // (o + 1/2)·q/p − 1/2 = ((2o + 1)·q − p) / 2p
            CoordMode::HalfPixel => Ok((
                IExpr::minus(
                    IExpr::times(IExpr::plus(IExpr::times(o, IExpr::Const(2)), IExpr::Const(1)), IExpr::Const(q)),
                    IExpr::Const(p),
                ),
                2 * p,
            )),
            mode => Err(self.node_err(id, format!("{what} with coordinate mode {mode:?} is not compiled"))),
        }
    }

    /// Linear resize, in the interpreter's blend: dims in order, each `(1 - w)·lo + w·hi` (or `lo` where `w` is
    /// 0), in the compute type (f32 for f16/bf16), rounded to the dtype at the end. A resized dim with static
    /// extents takes the taps of [`kiln_ir::interp::linear_taps`] (the interpreter's own) from constant tables
    /// indexed by the output index (any scale, every coordinate mode); one with a symbolic extent computes them
    /// in exact integer arithmetic, for an integer scale or its inverse with asymmetric or half-pixel
    /// coordinates (the coordinate `a/b` then is an exact fraction of the output index).
    pub(super) fn resize_linear(
        &mut self,
        id: NodeId,
        x: Value,
        r: &Resize,
        out_shape: &Shape,
        idx: &[IExpr],
    ) -> Result<Expr, LowerError> {
        let shape = self.shape(x)?;
        let dtype = self.dtype(x)?;
        if !dtype.is_float() {
            return Err(self.node_err(id, format!("linear resize of {dtype}")));
        }
        let ct = super::compute_type(dtype);
        let mut taps = Vec::new();
        for d in 0..idx.len() {
            if shape.0[d] == out_shape.0[d] && r.keeps_dim(d) {
                continue;
            }
            let o = idx[d].clone();
            let tap = match (shape.0[d].as_static(), out_shape.0[d].as_static()) {
                (Some(0), _) => return Err(self.node_err(id, format!("linear resize of the empty dim {d}"))),
                (Some(_), Some(m)) if m > MAX_TAP_TABLE => {
                    let why = format!("linear resize to an extent of {m} (tap tables hold at most {MAX_TAP_TABLE})");
                    return Err(self.node_err(id, why));
                }
                (Some(n), Some(m)) => self.tabled_tap(x, r, d, n as usize, m as usize, ct, o),
                _ => self.rational_tap(id, r, d, &shape.0[d], ct, o)?,
            };
            taps.push((d, tap));
        }
        let blended = self.blend(x, dtype, ct, &taps, idx.to_vec())?;
        Ok(if ct == dtype { blended } else { Expr::cast(blended, ct, dtype) })
    }

    /// Cubic resizing, and antialiased linear or cubic resizing, on static extents: along each resized dim the
    /// taps of [`kiln_ir::interp::filter_taps`] (the interpreter's own) come from constant tables indexed by the
    /// output index — `k` input indices and `k` weights per output index — and are summed in the interpreter's
    /// order (skipping a weight of 0), the sum over a later dim holding the sums over the earlier ones, in f64 as
    /// the interpreter sums; a dim every output of which takes its own input element is not touched. Refused (a fallback)
    /// on a symbolic extent, or where the taps of all dims would multiply to more than [`MAX_FILTER_TERMS`] loads
    /// per output element (a large antialiased downscale, better done one dim at a time).
    pub(super) fn resize_filtered(
        &mut self,
        id: NodeId,
        x: Value,
        r: &Resize,
        out_shape: &Shape,
        idx: &[IExpr],
    ) -> Result<Expr, LowerError> {
        let shape = self.shape(x)?;
        let dtype = self.dtype(x)?;
        let what = format!("{} resizing{}", r.mode.name(), if r.antialias { " with antialiasing" } else { "" });
        if !dtype.is_float() {
            return Err(self.node_err(id, format!("{what} of {dtype}")));
        }
        // The interpreter's arithmetic: f64 weights and sums, rounded to the dtype once (through f32 for the half
        // types, as the interpreter stores them).
        let ct = DType::F64;
        let mut axes = Vec::new();
        let mut terms: usize = 1;
        for d in 0..idx.len() {
            let (n, m) = self.tabled_extents(id, &shape, out_shape, d, &what)?;
            let taps = kiln_ir::interp::filter_taps(r, d, n, m).map_err(|e| self.node_err(id, e))?;
            let identity = n == m
                && taps.iter().enumerate().all(|(o, t)| t.iter().all(|&(i, w)| w == 0.0 || (i == o && w == 1.0)));
            if identity {
                continue;
            }
            let k = taps.iter().map(Vec::len).max().unwrap_or(1);
            terms = terms.saturating_mul(k);
            if terms > MAX_FILTER_TERMS {
                let why = format!("{what} needs more than {MAX_FILTER_TERMS} taps per output element");
                return Err(self.node_err(id, why));
            }
            let (mut is, mut ws) = (Vec::with_capacity(taps.len() * k), Vec::with_capacity(taps.len() * k));
            for t in &taps {
                for j in 0..k {
                    let (i, w) = t.get(j).copied().unwrap_or((0, 0.0));
                    is.push(i as i64);
                    ws.push(w);
                }
            }
            let len = vec![taps.len() * k];
            let ws = Tensor::from_vec(len.clone(), ws).expect("k taps per output index");
            let is = Tensor::from_vec(len, is).expect("k taps per output index");
            axes.push((d, k as i64, self.table(x, is), self.table(x, ws)));
        }
        let sum = self.filter_sum(x, dtype, ct, &axes, idx.to_vec())?;
        Ok(match dtype {
            DType::F64 => sum,
            DType::F16 | DType::BF16 => Expr::cast(Expr::cast(sum, ct, DType::F32), DType::F32, dtype),
            _ => Expr::cast(sum, ct, dtype),
        })
    }

    /// The filtered sum along the last of `axes` (dim, taps per output, index table, weight table) of the sums
    /// along the earlier ones, `src` holding the output index in the dims not yet replaced by a tap.
    fn filter_sum(
        &mut self,
        x: Value,
        dtype: DType,
        ct: DType,
        axes: &[(usize, i64, ArgId, ArgId)],
        src: Vec<IExpr>,
    ) -> Result<Expr, LowerError> {
        let Some((&(d, k, it, wt), rest)) = axes.split_last() else {
            let v = self.value_at(x, &src)?;
            return Ok(if ct == dtype { v } else { Expr::cast(v, dtype, ct) });
        };
        let zero = Expr::Const(Scalar::from_f64(ct, 0.0));
        let mut sum: Option<Expr> = None;
        for j in 0..k {
            let at = self.simp(IExpr::plus(IExpr::times(src[d].clone(), IExpr::Const(k)), IExpr::Const(j)));
            let mut s = src.clone();
            s[d] = IExpr::read(it, at.clone());
            let v = self.filter_sum(x, dtype, ct, rest, s)?;
            let w = Expr::Load { arg: wt, index: at };
            let term = Expr::select(
                Expr::binary(BinaryOp::Eq, w.clone(), zero.clone()),
                zero.clone(),
                Expr::binary(BinaryOp::Mul, w, v),
            );
            sum = Some(match sum {
                None => term,
                Some(acc) => Expr::binary(BinaryOp::Add, acc, term),
            });
        }
        Ok(sum.unwrap_or(zero))
    }

    /// The static extents `(in, out)` of resized dim `d`, which constant tables of `out` entries can serve;
    /// refused (naming `what`) on a symbolic or empty extent or a table too large.
    fn tabled_extents(
        &self,
        id: NodeId,
        shape: &Shape,
        out_shape: &Shape,
        d: usize,
        what: &str,
    ) -> Result<(usize, usize), LowerError> {
        let (Some(n), Some(m)) = (shape.0[d].as_static(), out_shape.0[d].as_static()) else {
            return Err(self.node_err(id, format!("{what} of a symbolic extent is not compiled yet")));
        };
        if n == 0 || m > MAX_TAP_TABLE {
            return Err(self.node_err(id, format!("{what} from {n} to {m} elements is not compiled")));
        }
        Ok((n as usize, m as usize))
    }

    /// `value` — a resize's element at output index `idx` — or, for `tf_crop_and_resize` coordinates, the
    /// extrapolation value where the output index falls outside the input along any dim: per resized dim a constant
    /// table of the interpreter's verdicts ([`kiln_ir::interp::outside_taps`]), static extents only.
    pub(super) fn crop_extrapolation(
        &mut self,
        id: NodeId,
        x: Value,
        r: &Resize,
        out_shape: &Shape,
        idx: &[IExpr],
        value: Expr,
    ) -> Result<Expr, LowerError> {
        if r.coord != CoordMode::TfCropAndResize {
            return Ok(value);
        }
        let shape = self.shape(x)?;
        let dtype = self.dtype(x)?;
        if matches!(dtype, DType::I64 | DType::U64) {
            return Err(self.node_err(id, format!("tf_crop_and_resize of {dtype}")));
        }
        let mut outside: Option<Expr> = None;
        for d in 0..idx.len() {
            let (n, m) = self.tabled_extents(id, &shape, out_shape, d, "tf_crop_and_resize")?;
            let flags = kiln_ir::interp::outside_taps(r, d, n, m);
            if !flags.contains(&true) {
                continue;
            }
            let t = Tensor::from_vec(vec![m], flags.into_iter().map(i64::from).collect())
                .expect("one flag per output index");
            let table = self.table(x, t);
            let here = Expr::cond(CmpOp::Lt, IExpr::Const(0), IExpr::read(table, idx[d].clone()));
            outside = Some(match outside {
                None => here,
                Some(o) => Expr::binary(BinaryOp::Or, o, here),
            });
        }
        Ok(match outside {
            None => value,
            Some(o) => Expr::select(o, Expr::Const(Scalar::from_f64(dtype, r.extrapolation)), value),
        })
    }

    /// The tap of output index `o` along dim `d` (static extents `n` → `m`), read from constant tables.
    #[allow(clippy::too_many_arguments)]
    fn tabled_tap(&mut self, x: Value, r: &Resize, d: usize, n: usize, m: usize, ct: DType, o: IExpr) -> Tap {
        let t = kiln_ir::interp::linear_taps(r, d, n, m);
        let ints = |f: fn(&(usize, usize, f64)) -> usize| {
            Tensor::from_vec(vec![m], t.iter().map(|p| f(p) as i64).collect()).expect("one per output index")
        };
        let w: Vec<f64> = t.iter().map(|p| p.2).collect();
        let w = match ct {
            DType::F64 => Tensor::from_vec(vec![m], w),
            _ => Tensor::from_vec(vec![m], w.into_iter().map(|v| v as f32).collect()),
        }
        .expect("one per output index");
        let (i0, i1, w) = (self.table(x, ints(|p| p.0)), self.table(x, ints(|p| p.1)), self.table(x, w));
        Tap { i0: IExpr::read(i0, o.clone()), i1: IExpr::read(i1, o.clone()), w: Expr::Load { arg: w, index: o } }
    }

    /// The tap of output index `o` along dim `d` of symbolic input extent `n`, by integer arithmetic: the
    /// coordinate is `a/b`, clamped into `[0, n - 1]` as the interpreter clamps it.
    fn rational_tap(
        &mut self,
        id: NodeId,
        r: &Resize,
        d: usize,
        n: &Dim,
        ct: DType,
        o: IExpr,
    ) -> Result<Tap, LowerError> {
        let (a, b) = self.rational_coord(id, r, d, o, "linear resize of a symbolic extent")?;
        let a = self.simp(a);
        let floor = self.simp(IExpr::floor_div(a.clone(), IExpr::Const(b)));
        let n = self.dim(n);
        let last = self.simp(IExpr::minus(n, IExpr::Const(1)));
        let i0 = self.simp(IExpr::max(IExpr::min(floor.clone(), last.clone()), IExpr::Const(0)));
        let i1 = self.simp(IExpr::min(IExpr::plus(i0.clone(), IExpr::Const(1)), last.clone()));
        // Inside `[0, n - 1)` the weight is the fraction; clamped to either end it is 0.
        let rem = self.simp(IExpr::minus(a.clone(), IExpr::times(floor.clone(), IExpr::Const(b))));
        let frac = Expr::binary(BinaryOp::Div, Expr::index(rem, DType::F64), Expr::Const(Scalar::F64(b as f64)));
        let inside =
            Expr::binary(BinaryOp::And, Expr::cond(CmpOp::Le, IExpr::Const(0), a), Expr::cond(CmpOp::Lt, floor, last));
        let zero = Expr::Const(Scalar::from_f64(DType::F64, 0.0));
        let w = Expr::select(inside, frac, zero);
        Ok(Tap { i0, i1, w: if ct == DType::F64 { w } else { Expr::cast(w, DType::F64, ct) } })
    }

    /// The blend along the last of `taps`' dims of the blends along the earlier ones, `src` holding the output
    /// index in the dims not yet replaced by a tap.
    fn blend(
        &mut self,
        x: Value,
        dtype: DType,
        ct: DType,
        taps: &[(usize, Tap)],
        src: Vec<IExpr>,
    ) -> Result<Expr, LowerError> {
        let Some(((d, tap), rest)) = taps.split_last() else {
            let v = self.value_at(x, &src)?;
            return Ok(if ct == dtype { v } else { Expr::cast(v, dtype, ct) });
        };
        let at = |i: &IExpr| {
            let mut s = src.clone();
            s[*d] = i.clone();
            s
        };
        let lo = self.blend(x, dtype, ct, rest, at(&tap.i0))?;
        let hi = self.blend(x, dtype, ct, rest, at(&tap.i1))?;
        let w = tap.w.clone();
        let one = Expr::Const(Scalar::from_f64(ct, 1.0));
        let zero = Expr::Const(Scalar::from_f64(ct, 0.0));
        let mix = Expr::binary(
            BinaryOp::Add,
            Expr::binary(BinaryOp::Mul, Expr::binary(BinaryOp::Sub, one, w.clone()), lo.clone()),
            Expr::binary(BinaryOp::Mul, w.clone(), hi),
        );
        Ok(Expr::select(Expr::binary(BinaryOp::Eq, w, zero), lo, mix))
    }

    /// The static extent of dim `d`, or an error naming the op that needs it.
    fn static_extent(&self, id: NodeId, shape: &Shape, d: usize, what: &str) -> Result<i64, LowerError> {
        shape.0[d]
            .as_static()
            .and_then(|n| i64::try_from(n).ok())
            .ok_or_else(|| self.node_err(id, format!("{what} on symbolic dim {d} needs a static extent")))
    }

    /// Constant, edge or reflect padding (negative pads crop).
    pub(super) fn pad(&mut self, id: NodeId, x: Value, p: &Pad, idx: &[IExpr]) -> Result<Expr, LowerError> {
        let shape = self.shape(x)?;
        let rank = shape.rank();
        let dtype = self.dtype(x)?;
        let fill = Expr::Const(Scalar::from_f64(dtype, p.value));
        let mut own = Vec::with_capacity(rank);
        let mut inside: Option<Expr> = None;
        for d in 0..rank {
            let (b, e) = (p.pads[d], p.pads[d + rank]);
            if b == 0 && e == 0 {
                own.push(idx[d].clone());
                continue;
            }
            let i = self.simp(IExpr::minus(idx[d].clone(), IExpr::Const(b)));
            if p.mode == PadMode::Constant && shape.0[d].as_static().is_none() {
                // A symbolic extent (maybe 0 at run time: the clamped read then lands on the one element every
                // buffer has, and the select picks the fill).
                let n = self.dim(&shape.0[d].clone());
                let last = self.simp(IExpr::minus(n.clone(), IExpr::Const(1)));
                let mut conds = vec![Expr::cond(CmpOp::Lt, i.clone(), n)];
                if b > 0 {
                    conds.push(Expr::cond(CmpOp::Le, IExpr::Const(0), i.clone()));
                }
                for c in conds {
                    inside = Some(match inside {
                        None => c,
                        Some(prev) => Expr::binary(BinaryOp::And, prev, c),
                    });
                }
                own.push(IExpr::max(IExpr::min(i, last), IExpr::Const(0)));
                continue;
            }
            let n = self.static_extent(id, &shape, d, "pad")?;
            let src = match p.mode {
                PadMode::Constant if n == 0 => return Ok(fill),
                PadMode::Constant => {
                    let mut conds = Vec::new();
                    if b > 0 {
                        conds.push(Expr::cond(CmpOp::Le, IExpr::Const(0), i.clone()));
                    }
                    if e > 0 {
                        conds.push(Expr::cond(CmpOp::Lt, i.clone(), IExpr::Const(n)));
                    }
                    for c in conds {
                        inside = Some(match inside {
                            None => c,
                            Some(prev) => Expr::binary(BinaryOp::And, prev, c),
                        });
                    }
                    IExpr::max(IExpr::min(i, IExpr::Const(n - 1)), IExpr::Const(0))
                }
                PadMode::Edge if n > 0 => IExpr::max(IExpr::min(i, IExpr::Const(n - 1)), IExpr::Const(0)),
                PadMode::Wrap if n > 0 => self.simp(IExpr::modulo(i, IExpr::Const(n))),
                PadMode::Reflect if n > 1 => {
                    let period = 2 * (n - 1);
                    let r = self.simp(IExpr::modulo(i, IExpr::Const(period)));
                    IExpr::select(
                        CmpOp::Lt,
                        r.clone(),
                        IExpr::Const(n),
                        r.clone(),
                        IExpr::minus(IExpr::Const(period), r),
                    )
                }
                mode => {
                    return Err(self
                        .node_err(id, format!("{} padding of dim {d} (extent {n}) has nothing to copy", mode.name())));
                }
            };
            own.push(src);
        }
        let value = self.value_at(x, &own)?;
        Ok(match inside {
            Some(c) => Expr::select(c, value, fill),
            None => value,
        })
    }

    /// Joins operands along an axis: each is read at its clamped position, and selects over the axis ranges
    /// pick one.
    pub(super) fn concat(&mut self, id: NodeId, ins: &[Value], axis: i64, idx: &[IExpr]) -> Result<Expr, LowerError> {
        let rank = idx.len();
        let axis = normalize_axis(axis, rank).map_err(|m| self.node_err(id, m))?;
        if ins.len() == 1 {
            return self.value_at(ins[0], idx);
        }
        // (start, extent, operand) of each operand not known to be empty; extents may be symbolic (a cache's
        // past length), in which case an operand may be empty at run time: its clamped read then lands on the
        // one element the runtime guarantees every buffer (an empty one included) and is never selected.
        let mut parts = Vec::new();
        let mut start = IExpr::Const(0);
        for &x in ins {
            let d = self.shape(x)?.0[axis].clone();
            let n = self.dim(&d);
            if d.as_static() != Some(0) {
                parts.push((start.clone(), n.clone(), x));
            }
            start = self.simp(IExpr::plus(start, n));
        }
        let mut result: Option<Expr> = None;
        // Built from the last part backwards: select(i < end_k, part_k, rest).
        for (start, n, x) in parts.iter().rev() {
            let mut own = idx.to_vec();
            let local = self.simp(IExpr::minus(idx[axis].clone(), start.clone()));
            let last = self.simp(IExpr::minus(n.clone(), IExpr::Const(1)));
            own[axis] = IExpr::max(IExpr::min(local, last), IExpr::Const(0));
            let v = self.value_at(*x, &own)?;
            result = Some(match result {
                None => v,
                Some(rest) => {
                    let end = self.simp(IExpr::plus(start.clone(), n.clone()));
                    Expr::select(Expr::cond(CmpOp::Lt, idx[axis].clone(), end), v, rest)
                }
            });
        }
        result.ok_or_else(|| self.node_err(id, "concat of only empty operands is never read"))
    }

    /// Result `k` of a split: the operand shifted along the axis by the sizes before it.
    pub(super) fn split(
        &mut self,
        id: NodeId,
        x: Value,
        s: &Split,
        k: usize,
        idx: &[IExpr],
    ) -> Result<Expr, LowerError> {
        let axis = normalize_axis(s.axis, idx.len()).map_err(|m| self.node_err(id, m))?;
        let offset: i64 = s.sizes[..k].iter().sum();
        let mut own = idx.to_vec();
        own[axis] = IExpr::plus(idx[axis].clone(), IExpr::Const(offset));
        self.value_at(x, &own)
    }

    /// The operand's extents as i64: a select over the position.
    pub(super) fn shape_of(&mut self, x: Value, idx: &[IExpr]) -> Result<Expr, LowerError> {
        let shape = self.shape(x)?;
        let mut value = IExpr::Const(0);
        for (d, dim) in shape.0.iter().enumerate().rev() {
            let n = self.dim(dim);
            value = IExpr::select(CmpOp::Eq, idx[0].clone(), IExpr::Const(d as i64), n, value);
        }
        Ok(Expr::index(self.simp(value), kiln_ir::DType::I64))
    }
}

/// One resized dim's linear tap at an output index: the two source indices and the weight of the second.
struct Tap {
    i0: IExpr,
    i1: IExpr,
    w: Expr,
}

/// The most output indices a linear resize's constant tap tables cover (three tables of this many elements are
/// built at compile time; an absurd extent in a model must not allocate them).
const MAX_TAP_TABLE: u64 = 1 << 20;

/// The most loads per output element a compiled cubic or antialiased resize makes (the product of the resized
/// dims' taps: 16 for a 2-D cubic resize).
const MAX_FILTER_TERMS: usize = 64;
