//! Random graphs for differential testing: [`random_graph`] builds a small random graph and its inputs from a
//! seed — elementwise math, broadcasting binaries, reductions, softmax, layer norm, matmuls, layout ops, casts and
//! GELU over random shapes (ones, odd extents, now and then an extent of zero), with weights bound in the graph's
//! weight store. `kiln::difftest` compiles such graphs and compares them with the interpreter.
//!
//! Invariants: the same seed and [`GenOptions`] always give the same graph and inputs (a [`SplitMix64`] stream, no
//! other randomness), so a failing seed is a complete reproducer; every generated graph verifies, because each op
//! goes through the builder's type inference and a rejected choice is undone and replaced by another.

use std::collections::BTreeMap;

use crate::op::{BinaryOp, Broadcast, Concat, Gelu, GeluApprox, LayerNorm, Reduce, ReduceKind, Slice, UnaryOp};
use crate::{Builder, DType, Data, Graph, Op, Shape, Tensor, Value};

/// Random results stay below this many elements, keeping the interpreter quick.
const MAX_ELEMENTS: usize = 2048;

/// The SplitMix64 generator: tiny, well distributed, and the same on every platform.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A stream starting from `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`; `n` must be positive.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with chance `1/n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// One of `items`, uniformly; `items` must not be empty.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// What [`random_graph`] may generate.
#[derive(Clone, Debug)]
pub struct GenOptions {
    /// Ops per graph: between 1 and this many (a leaf operand or a helper such as `abs` before `sqrt` rides along
    /// with its op).
    pub max_ops: usize,
    /// The largest rank of the first graph inputs (later values may grow by broadcasts and batched matmuls).
    pub max_rank: usize,
    /// Each random extent is 0 with chance 1 in this (0: never).
    pub zero_extent_one_in: usize,
    /// Whether float inputs now and then hold NaN and ±inf.
    pub special_values: bool,
    /// The kinds of op to pick among (each kind has a fixed relative weight).
    pub ops: Vec<OpKind>,
}

impl Default for GenOptions {
    fn default() -> GenOptions {
        GenOptions { max_ops: 12, max_rank: 4, zero_extent_one_in: 40, special_values: true, ops: OpKind::ALL.to_vec() }
    }
}

/// The graph for `seed` and a value for each of its inputs.
pub fn random_graph(seed: u64, options: &GenOptions) -> (Graph, BTreeMap<String, Tensor>) {
    let mut g = Generator {
        rng: SplitMix64::new(seed),
        options,
        b: Builder::new(format!("difftest_{seed}")),
        pool: Vec::new(),
        inputs: BTreeMap::new(),
        leaves: 0,
    };
    g.build();
    let Generator { mut b, pool, inputs, .. } = g;
    for (i, e) in pool.iter().filter(|e| !e.used).enumerate() {
        b.output(&format!("y{i}"), e.value);
    }
    (b.finish(), inputs)
}

/// A value the next ops may use.
#[derive(Copy, Clone, Debug)]
struct Entry {
    value: Value,
    /// A float computed without rounding (inputs and the ops that only move or pick values), so the backends agree
    /// on it bit for bit and a float-to-int cast of it is safe to compare exactly.
    exact: bool,
    /// Consumed by a later op; the unused ones become the graph's outputs.
    used: bool,
    /// The most matmuls on a path from a leaf to this value.
    matmuls: usize,
}

type Step = Result<(), String>;

struct Generator<'a> {
    rng: SplitMix64,
    options: &'a GenOptions,
    b: Builder,
    pool: Vec<Entry>,
    inputs: BTreeMap<String, Tensor>,
    leaves: usize,
}

/// The kinds of op the generator picks among ([`GenOptions::ops`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Elementwise unary math: relu, neg, abs, exp, tanh, sigmoid, erf, sqrt of `|x|` (of `|x| + 1` when `x` is
    /// rounded), log of `|x| + 1`.
    Unary,
    /// add, sub, mul, div, max, min with numpy broadcasting, against another value or a new leaf.
    Binary,
    /// sum, mean, max, min over random axes, with and without `keep_dims`.
    Reduce,
    /// Softmax along a random axis.
    Softmax,
    /// Layer norm from a random axis, with a scale and sometimes a bias.
    LayerNorm,
    /// 2-D, matrix-vector and batched matmuls, batch dims broadcasting; at most two in a chain.
    MatMul,
    /// Reshapes: flatten, merge or split dims, add or drop a unit dim.
    Reshape,
    /// A random permutation.
    Transpose,
    /// Broadcast to a wider shape.
    Broadcast,
    /// Slices with random bounds (past the ends too) and steps (negative too).
    Slice,
    /// Concatenation with new leaves or the value itself.
    Concat,
    /// f32 to i32 (of exactly computed values, scaled by 8) and i32 to f32.
    Cast,
    /// GELU, exact and tanh-approximated.
    Gelu,
}

impl OpKind {
    /// Every kind.
    pub const ALL: &[OpKind] = &[
        OpKind::Unary,
        OpKind::Binary,
        OpKind::Reduce,
        OpKind::Softmax,
        OpKind::LayerNorm,
        OpKind::MatMul,
        OpKind::Reshape,
        OpKind::Transpose,
        OpKind::Broadcast,
        OpKind::Slice,
        OpKind::Concat,
        OpKind::Cast,
        OpKind::Gelu,
    ];

    /// How often the kind is picked, relative to the others.
    fn weight(self) -> usize {
        match self {
            OpKind::Binary => 3,
            OpKind::Unary | OpKind::MatMul => 2,
            _ => 1,
        }
    }
}

fn err(e: crate::Error) -> String {
    e.to_string()
}

impl Generator<'_> {
    fn build(&mut self) {
        let n_inputs = 1 + self.rng.below(2);
        for _ in 0..n_inputs {
            let dtype = if self.rng.one_in(5) { DType::I32 } else { DType::F32 };
            let rank = self.rng.below(self.options.max_rank + 1);
            let dims = self.shape(rank);
            let v = self.input(dtype, &dims);
            self.pool.push(Entry { value: v, exact: true, used: false, matmuls: 0 });
        }
        let ops = 1 + self.rng.below(self.options.max_ops.max(1));
        for _ in 0..ops {
            // A rejected choice (a shape the op refuses, a dtype it does not take) is undone and another is tried.
            for _ in 0..10 {
                let saved = (self.b.graph().clone(), self.pool.clone(), self.inputs.clone(), self.leaves);
                let Some(kind) = self.pick_kind() else { return };
                if self.step(kind).is_ok() {
                    break;
                }
                let (graph, pool, inputs, leaves) = saved;
                self.b = Builder::from_graph(graph);
                (self.pool, self.inputs, self.leaves) = (pool, inputs, leaves);
            }
        }
    }

    fn pick_kind(&mut self) -> Option<OpKind> {
        let total: usize = self.options.ops.iter().map(|k| k.weight()).sum();
        if total == 0 {
            return None;
        }
        let mut r = self.rng.below(total);
        for &k in &self.options.ops {
            if r < k.weight() {
                return Some(k);
            }
            r -= k.weight();
        }
        None
    }

    /// A random extent: mostly small, often 1 or odd, now and then 0.
    fn extent(&mut self) -> usize {
        let z = self.options.zero_extent_one_in;
        if z > 0 && self.rng.one_in(z) {
            return 0;
        }
        self.rng.pick(&[1, 1, 2, 3, 4, 5, 7, 8, 17])
    }

    fn shape(&mut self, rank: usize) -> Vec<usize> {
        let mut dims: Vec<usize> = (0..rank).map(|_| self.extent()).collect();
        while dims.iter().product::<usize>() > MAX_ELEMENTS {
            let i = (0..rank).max_by_key(|&i| dims[i]).expect("a large shape has dims");
            dims[i] = 2;
        }
        dims
    }

    fn values(&mut self, dtype: DType, dims: &[usize]) -> Tensor {
        let n: usize = dims.iter().product();
        let data = if dtype.is_float() {
            let scale = self.rng.pick(&[1.0, 1.0, 4.0]);
            let mut v: Vec<f64> = (0..n).map(|_| (self.rng.unit() * 2.0 - 1.0) * scale).collect();
            if self.options.special_values && n > 0 && self.rng.one_in(12) {
                for _ in 0..1 + self.rng.below(2) {
                    let i = self.rng.below(n);
                    v[i] = self.rng.pick(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY]);
                }
            }
            Data::from_f64_iter(dtype, v.into_iter())
        } else {
            Data::from_i64_iter(dtype, (0..n).map(|_| self.rng.below(15) as i64 - 5))
        };
        Tensor::new(dims.to_vec(), data).expect("the data has the shape's element count")
    }

    fn input(&mut self, dtype: DType, dims: &[usize]) -> Value {
        let name = format!("x{}", self.leaves);
        self.leaves += 1;
        let t = self.values(dtype, dims);
        self.inputs.insert(name.clone(), t);
        let shape = Shape(dims.iter().map(|&d| d.into()).collect());
        self.b.input(&name, dtype, shape).expect("input names are fresh")
    }

    /// A fresh operand: a graph input, a weight, or a constant.
    fn leaf(&mut self, dtype: DType, dims: &[usize]) -> Result<Value, String> {
        match self.rng.below(3) {
            0 => Ok(self.input(dtype, dims)),
            1 => {
                let name = format!("w{}", self.leaves);
                self.leaves += 1;
                let t = self.values(dtype, dims);
                self.b.weight(&name, t).map_err(err)
            }
            _ => {
                let t = self.values(dtype, dims);
                self.b.constant(t).map_err(err)
            }
        }
    }

    /// An operand from the pool, usually a recent one (so graphs grow deep as well as wide).
    fn operand(&mut self, accept: impl Fn(DType) -> bool) -> Result<usize, String> {
        let fits: Vec<usize> = (0..self.pool.len()).filter(|&i| accept(self.dtype(self.pool[i].value))).collect();
        match fits.last() {
            None => Err("no operand of a fitting dtype".into()),
            Some(&last) if self.rng.below(5) < 3 => Ok(last),
            Some(_) => Ok(self.rng.pick(&fits)),
        }
    }

    fn dtype(&self, v: Value) -> DType {
        self.b.type_of(v).expect("pool values exist").dtype
    }

    fn dims(&self, v: Value) -> Vec<usize> {
        self.b.type_of(v).expect("pool values exist").shape.as_static().expect("the generator's shapes are static")
    }

    /// Marks `used` as consumed and adds `v` to the pool.
    fn push(&mut self, used: &[usize], v: Value, exact: bool) -> Step {
        let n: usize = self.dims(v).iter().product();
        if n > MAX_ELEMENTS * 4 {
            return Err(format!("a result of {n} elements"));
        }
        let matmuls = used.iter().map(|&i| self.pool[i].matmuls).max().unwrap_or(0);
        for &i in used {
            self.pool[i].used = true;
        }
        self.pool.push(Entry { value: v, exact, used: false, matmuls });
        Ok(())
    }

    fn step(&mut self, kind: OpKind) -> Step {
        match kind {
            OpKind::Unary => self.unary(),
            OpKind::Binary => self.binary(),
            OpKind::Reduce => self.reduce(),
            OpKind::Softmax => {
                let i = self.operand(DType::is_float)?;
                let x = self.pool[i].value;
                let rank = self.dims(x).len() as i64;
                let axis = self.axis(rank)?;
                let y = self.b.softmax(x, axis).map_err(err)?;
                self.push(&[i], y, false)
            }
            OpKind::LayerNorm => self.layer_norm(),
            OpKind::MatMul => self.matmul(),
            OpKind::Reshape => self.reshape(),
            OpKind::Transpose => {
                let i = self.operand(|_| true)?;
                let x = self.pool[i].value;
                let mut perm: Vec<i64> = (0..self.dims(x).len() as i64).collect();
                for k in (1..perm.len()).rev() {
                    perm.swap(k, self.rng.below(k + 1));
                }
                let y = self.b.transpose(x, &perm).map_err(err)?;
                let exact = self.pool[i].exact;
                self.push(&[i], y, exact)
            }
            OpKind::Broadcast => self.broadcast(),
            OpKind::Slice => self.slice(),
            OpKind::Concat => self.concat(),
            OpKind::Cast => self.cast(),
            OpKind::Gelu => {
                let i = self.operand(DType::is_float)?;
                let approximate = self.rng.pick(&[GeluApprox::None, GeluApprox::Tanh]);
                let y = self.b.op(Op::Gelu(Gelu { approximate }), &[self.pool[i].value]).map_err(err)?;
                self.push(&[i], y, false)
            }
        }
    }

    /// An axis of a rank-`rank` value, sometimes counted from the end.
    fn axis(&mut self, rank: i64) -> Result<i64, String> {
        if rank == 0 {
            return Err("no axis to choose".into());
        }
        let a = self.rng.below(rank as usize) as i64;
        Ok(if self.rng.one_in(3) { a - rank } else { a })
    }

    fn unary(&mut self) -> Step {
        let i = self.operand(|d| d != DType::Bool)?;
        let x = self.pool[i].value;
        if !self.dtype(x).is_float() {
            let kind = self.rng.pick(&[UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu]);
            let y = self.b.unary(kind, x).map_err(err)?;
            return self.push(&[i], y, true);
        }
        let exact = self.pool[i].exact;
        let (y, exact) = match self.rng.below(9) {
            0 => (self.b.relu(x), exact),
            1 => (self.b.neg(x), exact),
            2 => (self.b.abs(x), exact),
            3 => (self.b.exp(x), false),
            4 => (self.b.tanh(x), false),
            5 => (self.b.sigmoid(x), false),
            6 => (self.b.erf(x), false),
            7 => {
                // sqrt magnifies an absolute error near 0 (its slope is unbounded there), so a rounded operand is
                // kept at 1 or more; an exactly computed one is the same in both backends and may come close.
                let mut a = self.b.abs(x).map_err(err)?;
                if !exact {
                    let one = self.b.scalar(self.dtype(x), 1.0).map_err(err)?;
                    a = self.b.add(a, one).map_err(err)?;
                }
                (self.b.sqrt(a), false)
            }
            _ => {
                // log of a value kept away from 0, so its large slope near 0 does not magnify rounding.
                let a = self.b.abs(x).map_err(err)?;
                let one = self.b.scalar(self.dtype(x), 1.0).map_err(err)?;
                let a = self.b.add(a, one).map_err(err)?;
                (self.b.log(a), false)
            }
        };
        let y = y.map_err(err)?;
        self.push(&[i], y, exact)
    }

    /// Dims that broadcast against `dims`: some leading dims dropped, some set to 1, ones widened, or a dim
    /// prepended.
    fn broadcastable(&mut self, dims: &[usize]) -> Vec<usize> {
        let drop = if self.rng.one_in(3) { self.rng.below(dims.len() + 1) } else { 0 };
        let mut out: Vec<usize> = dims[drop..]
            .iter()
            .map(|&d| match self.rng.below(4) {
                0 => 1,
                1 if d == 1 => self.extent(),
                _ => d,
            })
            .collect();
        if drop == 0 && self.rng.one_in(6) {
            out.insert(0, self.extent());
        }
        out
    }

    fn binary(&mut self) -> Step {
        let i = self.operand(|d| d != DType::Bool)?;
        let x = self.pool[i].value;
        let dtype = self.dtype(x);
        let mut used = vec![i];
        let mut exact = self.pool[i].exact;
        let other = if self.rng.one_in(3) {
            let j = self.operand(|d| d == dtype)?;
            used.push(j);
            exact &= self.pool[j].exact;
            self.pool[j].value
        } else {
            let dims = self.broadcastable(&self.dims(x));
            self.leaf(dtype, &dims)?
        };
        let (a, b) = if self.rng.one_in(2) { (x, other) } else { (other, x) };
        let kind =
            self.rng.pick(&[BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min]);
        let b = if kind == BinaryOp::Div && (dtype.is_float() || !self.rng.one_in(4)) {
            // Keep divisors away from 0: a tiny divisor magnifies rounding past any tolerance. Integer division by
            // zero is an error both backends must report, so it stays possible now and then.
            let a = self.b.abs(b).map_err(err)?;
            let half = self.b.scalar(dtype, if dtype.is_float() { 0.5 } else { 1.0 }).map_err(err)?;
            self.b.add(a, half).map_err(err)?
        } else {
            b
        };
        let y = self.b.binary(kind, a, b).map_err(err)?;
        let exact = !dtype.is_float() || (exact && matches!(kind, BinaryOp::Max | BinaryOp::Min));
        self.push(&used, y, exact)
    }

    fn reduce(&mut self) -> Step {
        let i = self.operand(|d| d != DType::Bool)?;
        let x = self.pool[i].value;
        let rank = self.dims(x).len();
        let mut axes: Vec<i64> = (0..rank as i64).filter(|_| self.rng.one_in(2)).collect();
        if axes.is_empty() && rank > 0 {
            axes.push(self.rng.below(rank) as i64);
        }
        for a in &mut axes {
            if self.rng.one_in(3) {
                *a -= rank as i64;
            }
        }
        let kind = self.rng.pick(&[ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max, ReduceKind::Min]);
        let keep_dims = self.rng.one_in(2);
        let y = self.b.op(Op::Reduce(Reduce { kind, axes, keep_dims }), &[x]).map_err(err)?;
        let exact = self.pool[i].exact && matches!(kind, ReduceKind::Max | ReduceKind::Min);
        self.push(&[i], y, exact)
    }

    fn layer_norm(&mut self) -> Step {
        let i = self.operand(DType::is_float)?;
        let x = self.pool[i].value;
        let dims = self.dims(x);
        let axis = self.axis(dims.len() as i64)?;
        let from = if axis < 0 { axis + dims.len() as i64 } else { axis } as usize;
        let norm = dims[from..].to_vec();
        let dtype = self.dtype(x);
        let mut operands = vec![x];
        for _ in 0..1 + self.rng.below(2) {
            // Scale and bias broadcast against the normalized dims: a suffix of them, some dims 1.
            let keep = self.rng.below(norm.len() + 1);
            let dims: Vec<usize> =
                norm[norm.len() - keep..].iter().map(|&d| if self.rng.one_in(4) { 1 } else { d }).collect();
            operands.push(self.leaf(dtype, &dims)?);
        }
        let y = self.b.op(Op::LayerNorm(LayerNorm { axis, epsilon: 1e-5 }), &operands).map_err(err)?;
        self.push(&[i], y, false)
    }

    fn matmul(&mut self) -> Step {
        let i = self.operand(|d| d.is_float() || d == DType::I32)?;
        let x = self.pool[i].value;
        let dtype = self.dtype(x);
        if !dtype.is_float() && !self.rng.one_in(4) {
            return Err("integer matmuls are rare".into());
        }
        if self.pool[i].matmuls >= 2 {
            // Each matmul in a chain adds rounding in the summation order the backend picks; after a few, a result
            // that cancels to near 0 differs by more than the tolerance while every term is within a few ulps.
            return Err("a third matmul in a chain".into());
        }
        let dims = self.dims(x);
        let r = dims.len();
        if r == 0 {
            return Err("matmul needs rank 1 or more".into());
        }
        let n = self.extent();
        let y = if r >= 2 && self.rng.one_in(4) {
            // x on the right: [.., K, N]; the new left operand is [.., M, K] or [K].
            let k = dims[r - 2];
            let mut left = self.batch_dims(&dims[..r - 2]);
            if left.is_empty() && self.rng.one_in(3) {
                left = vec![k];
            } else {
                left.extend([n, k]);
            }
            let a = self.leaf(dtype, &left)?;
            self.b.matmul(a, x)
        } else {
            let k = dims[r - 1];
            let mut right = if r >= 2 { self.batch_dims(&dims[..r - 2]) } else { Vec::new() };
            if r == 1 && self.rng.one_in(3) {
                right.push(self.extent());
            }
            if r >= 2 && self.rng.one_in(5) {
                right = vec![k];
            } else {
                right.extend([k, n]);
            }
            let b = self.leaf(dtype, &right)?;
            self.b.matmul(x, b)
        };
        let y = y.map_err(err)?;
        self.push(&[i], y, !dtype.is_float())?;
        self.pool.last_mut().expect("just pushed").matmuls += 1;
        Ok(())
    }

    /// Batch dims of a new matmul operand that broadcast against `batch`: none, or some dropped and some 1.
    fn batch_dims(&mut self, batch: &[usize]) -> Vec<usize> {
        if self.rng.one_in(3) {
            return Vec::new();
        }
        let drop = self.rng.below(batch.len() + 1);
        batch[drop..].iter().map(|&d| if self.rng.one_in(3) { 1 } else { d }).collect()
    }

    fn reshape(&mut self) -> Step {
        let i = self.operand(|_| true)?;
        let x = self.pool[i].value;
        let mut dims = self.dims(x);
        match self.rng.below(5) {
            0 => dims = vec![dims.iter().product()],
            1 if dims.len() >= 2 => {
                let k = self.rng.below(dims.len() - 1);
                let merged = dims[k] * dims[k + 1];
                dims.splice(k..k + 2, [merged]);
            }
            2 if !dims.is_empty() => {
                let k = self.rng.below(dims.len());
                let d = dims[k];
                let divisors: Vec<usize> = (1..=d.max(1)).filter(|&f| d.is_multiple_of(f)).collect();
                let f = self.rng.pick(&divisors);
                dims.splice(k..k + 1, [f, d / f]);
            }
            3 => {
                let k = self.rng.below(dims.len() + 1);
                dims.insert(k, 1);
            }
            _ => match dims.iter().position(|&d| d == 1) {
                Some(k) => {
                    dims.remove(k);
                }
                None => return Err("no unit dim to remove".into()),
            },
        }
        let shape = Shape(dims.iter().map(|&d| d.into()).collect());
        let y = self.b.reshape(x, shape).map_err(err)?;
        let exact = self.pool[i].exact;
        self.push(&[i], y, exact)
    }

    fn broadcast(&mut self) -> Step {
        let i = self.operand(|_| true)?;
        let x = self.pool[i].value;
        let mut dims: Vec<usize> =
            self.dims(x).iter().map(|&d| if d == 1 && self.rng.one_in(2) { self.extent() } else { d }).collect();
        for _ in 0..self.rng.below(3) {
            dims.insert(0, self.extent());
        }
        let shape = Shape(dims.iter().map(|&d| d.into()).collect());
        let y = self.b.op(Op::Broadcast(Broadcast { shape }), &[x]).map_err(err)?;
        let exact = self.pool[i].exact;
        self.push(&[i], y, exact)
    }

    fn slice(&mut self) -> Step {
        let i = self.operand(|_| true)?;
        let x = self.pool[i].value;
        let dims = self.dims(x);
        if dims.is_empty() {
            return Err("cannot slice a scalar".into());
        }
        let mut s = Slice { starts: vec![], ends: vec![], axes: vec![], steps: vec![] };
        for (a, &d) in dims.iter().enumerate() {
            // Each axis with chance 1/2, and the last one when no other was chosen.
            let sliced = self.rng.one_in(2) || (a + 1 == dims.len() && s.axes.is_empty());
            if !sliced {
                continue;
            }
            let d = d as i64;
            let step = self.rng.pick(&[1, 1, 1, 2, 3, -1, -2]);
            // Bounds run past both ends (they are clamped), now and then to the extremes of i64.
            let start = self.rng.below(2 * d as usize + 5) as i64 - d - 2;
            let end = match self.rng.below(8) {
                0 if step > 0 => i64::MAX,
                0 => i64::MIN,
                _ => self.rng.below(2 * d as usize + 5) as i64 - d - 2,
            };
            s.axes.push(if self.rng.one_in(3) { a as i64 - dims.len() as i64 } else { a as i64 });
            s.starts.push(start);
            s.ends.push(end);
            s.steps.push(step);
        }
        let y = self.b.op(Op::Slice(s), &[x]).map_err(err)?;
        let exact = self.pool[i].exact;
        self.push(&[i], y, exact)
    }

    fn concat(&mut self) -> Step {
        let i = self.operand(|_| true)?;
        let x = self.pool[i].value;
        let dims = self.dims(x);
        let axis = self.axis(dims.len() as i64)?;
        let at = if axis < 0 { axis + dims.len() as i64 } else { axis } as usize;
        let dtype = self.dtype(x);
        let mut parts = vec![x];
        for _ in 0..1 + self.rng.below(2) {
            if self.rng.one_in(4) {
                parts.push(x);
            } else {
                let mut d = dims.clone();
                d[at] = self.extent();
                parts.push(self.leaf(dtype, &d)?);
            }
        }
        let k = self.rng.below(parts.len());
        parts.swap(0, k);
        let y = self.b.op(Op::Concat(Concat { axis }), &parts).map_err(err)?;
        let exact = self.pool[i].exact;
        self.push(&[i], y, exact)
    }

    fn cast(&mut self) -> Step {
        let i = self.operand(|d| d == DType::F32 || d == DType::I32)?;
        let x = self.pool[i].value;
        if self.dtype(x) == DType::I32 {
            let y = self.b.cast(x, DType::F32).map_err(err)?;
            return self.push(&[i], y, true);
        }
        if !self.pool[i].exact {
            // A rounded float may land on either side of an integer in the two backends.
            return Err("casting a rounded float to an integer".into());
        }
        // Scaling by a power of two is exact and spreads [-1, 1) over several integers.
        let eight = self.b.scalar(DType::F32, 8.0).map_err(err)?;
        let scaled = self.b.mul(x, eight).map_err(err)?;
        let y = self.b.cast(scaled, DType::I32).map_err(err)?;
        self.push(&[i], y, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_graph() {
        let options = GenOptions::default();
        for seed in 0..20 {
            let (a, ai) = random_graph(seed, &options);
            let (b, bi) = random_graph(seed, &options);
            assert_eq!(crate::print(&a), crate::print(&b));
            // Debug text, not `==`: NaN inputs are equal to themselves here.
            assert_eq!(format!("{ai:?}"), format!("{bi:?}"));
            crate::verify(&a).unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
        }
    }
}
