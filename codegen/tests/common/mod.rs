//! Shared harness of the kernel tests: lower a whole graph as one group, run the kernel with the reference
//! evaluator and the graph with the interpreter on the same random inputs, and compare.

#![allow(dead_code)] // each test binary uses part of the harness

use std::collections::BTreeMap;

use kiln_codegen::cpu::{CpuOptions, JitModule, KernelFn, KernelInfo};
use kiln_codegen::kernel::{self, ArgRole, Kernel, LowerOptions, SpacePolicy};
use kiln_ir::op::Op;
use kiln_ir::tensor::Data;
use kiln_ir::{DType, Dim, Graph, NodeId, Tensor};

/// Every node but the graph's inputs and parameters.
pub fn whole_group(g: &Graph) -> Vec<NodeId> {
    g.node_ids().filter(|&id| !matches!(g.node(id).op, Op::Input(_) | Op::Parameter(_))).collect()
}

/// Lowers `g` as one group, outputs in separate spaces allowed.
pub fn lower_whole(g: &Graph, name: &str) -> Result<Kernel, kernel::LowerError> {
    kernel::lower_with(g, &whole_group(g), name, &LowerOptions { spaces: SpacePolicy::Separate })
}

/// Float results may differ from the interpreter's by this much, relatively.
const FLOAT_TOLERANCE: f64 = 1e-6;

fn bound(shape: &kiln_ir::Shape, bindings: &[(&str, u64)]) -> Vec<usize> {
    shape
        .0
        .iter()
        .map(|d| match d {
            Dim::Static(n) => *n as usize,
            Dim::Sym(s) => {
                bindings.iter().find(|(n, _)| n == s).unwrap_or_else(|| panic!("unbound symbol {s}")).1 as usize
            }
        })
        .collect()
}

/// Checks `kernel` (lowered from `g`) against the interpreter on random inputs for a few seeds.
pub fn check_kernel(case: &str, g: &Graph, k: &Kernel, bindings: &[(&str, u64)]) {
    for seed in 0..3u64 {
        let mut inputs = BTreeMap::new();
        for (i, &id) in g.inputs().iter().enumerate() {
            let node = g.node(id);
            let Op::Input(inp) = &node.op else { unreachable!("inputs are input nodes") };
            let ty = &node.outputs[0];
            let t = Tensor::random(ty.dtype, bound(&ty.shape, bindings), seed * 1000 + i as u64);
            inputs.insert(inp.name.clone(), t);
        }
        let want = kiln_ir::interp::run(g, &inputs).unwrap_or_else(|e| panic!("{case}: interpreter: {e}"));
        let symbols: Vec<i64> = k
            .symbols
            .iter()
            .map(|s| bindings.iter().find(|(n, _)| n == s).unwrap_or_else(|| panic!("{case}: unbound {s}")).1 as i64)
            .collect();
        let mut args: Vec<Tensor> = k
            .launch_args()
            .map(|(_, a)| match a.role {
                ArgRole::Input => inputs.get(&a.name).unwrap_or_else(|| panic!("{case}: no input {}", a.name)).clone(),
                _ => Tensor::zeros(a.dtype, a.dims(&symbols)),
            })
            .collect();
        check_jit(case, k, &args, &symbols);
        kernel::eval(k, &mut args, &symbols).unwrap_or_else(|e| panic!("{case}: evaluator: {e}\n{}", kernel::print(k)));
        let compared = k.launch_args().filter(|(_, a)| a.role == ArgRole::Output).count();
        assert!(compared > 0 && compared >= distinct_outputs(g), "{case}: {compared} output buffer(s)");
        for ((_, a), got) in k.launch_args().zip(&args) {
            if a.role != ArgRole::Output {
                continue;
            }
            let (_, expected) =
                want.iter().find(|(n, _)| *n == a.name).unwrap_or_else(|| panic!("{case}: no output {}", a.name));
            compare(&format!("{case} (seed {seed}, output {})", a.name), got, expected, k);
        }
    }
}

/// The number of distinct values the graph outputs (each becomes one output buffer).
fn distinct_outputs(g: &Graph) -> usize {
    let mut vs: Vec<_> = g.outputs().iter().map(|(_, v)| *v).collect();
    vs.sort_unstable();
    vs.dedup();
    vs.len()
}

/// Parses, lowers as one group and checks a `.kir` graph.
pub fn check_kir(case: &str, text: &str, bindings: &[(&str, u64)]) -> Kernel {
    let g = kiln_ir::parse(text).unwrap_or_else(|e| panic!("{case}: parse: {e}"));
    let k = lower_whole(&g, case).unwrap_or_else(|e| panic!("{case}: lower: {e}"));
    check_kernel(case, &g, &k, bindings);
    k
}

fn compare(case: &str, got: &Tensor, want: &Tensor, k: &Kernel) {
    compare_to(case, got, want, k, FLOAT_TOLERANCE, "interpreter");
}

/// JIT results may differ from the evaluator's by this much, relatively.
const JIT_TOLERANCE: f64 = 1e-5;

/// Launch buffers: each argument's little-endian bytes in 8-byte-aligned storage.
pub struct Buffers {
    words: Vec<Vec<u64>>,
    lens: Vec<usize>,
}

impl Buffers {
    /// Copies of `args`' data; outputs are filled with the byte 0xA5 so an element never stored shows.
    pub fn new(k: &Kernel, args: &[Tensor]) -> Buffers {
        let mut words = Vec::new();
        let mut lens = Vec::new();
        for ((_, a), t) in k.launch_args().zip(args) {
            let mut bytes = t.data().to_le_bytes();
            if a.role == ArgRole::Output {
                bytes.iter_mut().for_each(|b| *b = 0xA5);
            }
            let mut w = vec![0u64; bytes.len().div_ceil(8).max(1)];
            // SAFETY: `w` holds at least `bytes.len()` bytes.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), w.as_mut_ptr() as *mut u8, bytes.len()) };
            lens.push(bytes.len());
            words.push(w);
        }
        Buffers { words, lens }
    }

    /// One pointer per launch argument.
    pub fn pointers(&mut self) -> Vec<*mut u8> {
        self.words.iter_mut().map(|w| w.as_mut_ptr() as *mut u8).collect()
    }

    /// The buffers as tensors shaped like `like`.
    pub fn tensors(&self, like: &[Tensor]) -> Vec<Tensor> {
        self.words
            .iter()
            .zip(&self.lens)
            .zip(like)
            .map(|((w, &n), t)| {
                // SAFETY: `w` holds at least `n` initialized bytes.
                let bytes = unsafe { std::slice::from_raw_parts(w.as_ptr() as *const u8, n) };
                let data = kiln_ir::tensor::Data::from_le_bytes(t.dtype(), bytes).expect("whole elements");
                Tensor::new(t.shape().to_vec(), data).expect("same element count")
            })
            .collect()
    }
}

/// How a test launches the parts of a kernel.
#[derive(Copy, Clone, Debug)]
pub enum Chunking {
    /// Each part once over its whole range.
    Whole,
    /// Parallel parts in chunks `[n/2, n)`, `[1, n/2)`, `[0, 1)` (in that order); parts in reverse order.
    Split,
}

/// Runs every part of kernel `f` (described by `info`) on `bufs`.
pub fn launch(f: KernelFn, info: &KernelInfo, bufs: &mut Buffers, symbols: &[i64], chunking: Chunking) {
    let ptrs = bufs.pointers();
    let call = |part: usize, begin: i64, end: i64| {
        // SAFETY: the pointers cover every launch argument with its declared size, the symbols are all given.
        unsafe { f(ptrs.as_ptr(), symbols.as_ptr(), part as i64, begin, end) };
    };
    let order: Vec<usize> = match chunking {
        Chunking::Whole => (0..info.parts.len()).collect(),
        Chunking::Split => (0..info.parts.len()).rev().collect(),
    };
    for p in order {
        let part = &info.parts[p];
        let n = part.trip_count(symbols).expect("extents over symbols only");
        match chunking {
            Chunking::Split if part.parallel && n > 1 => {
                call(p, n / 2, n);
                call(p, 1, n / 2);
                call(p, 0, 1);
            }
            _ => call(p, 0, n),
        }
    }
}

/// Runs `k` on `args` (inputs filled, outputs of the right shape) through the reference evaluator and through
/// the JIT, whole and in chunks, and compares: bitwise for integers and bools, within 1e-5 relative for floats
/// (NaN equals NaN).
pub fn check_jit(case: &str, k: &Kernel, args: &[Tensor], symbols: &[i64]) {
    check_jit_with(case, k, args, symbols, &CpuOptions::default());
}

/// [`check_jit`] with the emitter's options.
pub fn check_jit_with(case: &str, k: &Kernel, args: &[Tensor], symbols: &[i64], options: &CpuOptions) {
    let mut want = args.to_vec();
    kernel::eval(k, &mut want, symbols).unwrap_or_else(|e| panic!("{case}: evaluator: {e}"));
    let jit = JitModule::compile(std::slice::from_ref(k), options)
        .unwrap_or_else(|e| panic!("{case}: JIT: {e}\n{}", kernel::print(k)));
    for chunking in [Chunking::Whole, Chunking::Split] {
        let mut bufs = Buffers::new(k, args);
        launch(jit.entry(0), jit.info(0), &mut bufs, symbols, chunking);
        let got = bufs.tensors(args);
        for (((_, a), g), w) in k.launch_args().zip(&got).zip(&want) {
            if a.role == ArgRole::Output {
                compare_to(
                    &format!("{case} (JIT, {chunking:?}, output {})", a.name),
                    g,
                    w,
                    k,
                    JIT_TOLERANCE,
                    "evaluator",
                );
            }
        }
    }
}

fn compare_to(case: &str, got: &Tensor, want: &Tensor, k: &Kernel, tolerance: f64, oracle: &str) {
    assert_eq!(got.dtype(), want.dtype(), "{case}: dtype");
    assert_eq!(got.shape(), want.shape(), "{case}: shape");
    if !want.dtype().is_float() {
        assert_eq!(got.to_i64_vec(), want.to_i64_vec(), "{case}: values\n{}", kernel::print(k));
        return;
    }
    for (i, (g, w)) in got.to_f64_vec().into_iter().zip(want.to_f64_vec()).enumerate() {
        let ok = (g.is_nan() && w.is_nan())
            || g.to_bits() == w.to_bits()
            || (g - w).abs() <= tolerance * g.abs().max(w.abs());
        assert!(ok, "{case}: element {i} is {g}, the {oracle} gives {w}\n{}", kernel::print(k));
    }
}

pub const FLOATS: &[f64] = &[
    f64::NAN,
    1.5,
    f64::INFINITY,
    -2.5,
    f64::NEG_INFINITY,
    -0.0,
    0.5,
    0.0,
    2.5,
    3.0e38,
    -1e-30,
    88.5,
    -100.0,
    0.3,
    -0.7,
    1e-40,
    65504.0,
    70000.0,
    -3.5,
    1.0 + 1.0 / 2048.0,
    7.25,
];

pub const INTS: &[i64] = &[i64::MIN, i64::MAX, -1, 0, 1, 7, -7, 3, 100, -100, 64, 8, 31, 32, 63, -128, 127, 255, 200];

/// A tensor cycling through the edge values of its dtype, starting at `seed`.
pub fn edge_tensor(dtype: DType, shape: Vec<usize>, seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let data = if dtype.is_float() {
        Data::from_f64_iter(dtype, (0..n).map(|i| FLOATS[(i + seed) % FLOATS.len()]))
    } else {
        Data::from_i64_iter(dtype, (0..n).map(|i| INTS[(i + seed) % INTS.len()]))
    };
    Tensor::new(shape, data).unwrap()
}

/// Divisors and exponents without zeros, -1 or negatives (which the evaluator reports as errors).
pub fn safe_tensor(dtype: DType, shape: Vec<usize>, seed: usize) -> Tensor {
    const SAFE: &[i64] = &[3, 2, 5, 7, 1, 100, 9, 13, 4];
    let n: usize = shape.iter().product();
    Tensor::new(shape, Data::from_i64_iter(dtype, (0..n).map(|i| SAFE[(i + seed) % SAFE.len()]))).unwrap()
}

/// Launch arguments of `k` for `symbols`: inputs named `d*` get [`safe_tensor`] values, other inputs
/// [`edge_tensor`] values (from `seed`), outputs zeros.
pub fn edge_args(k: &Kernel, symbols: &[i64], seed: usize) -> Vec<Tensor> {
    k.launch_args()
        .enumerate()
        .map(|(i, (_, a))| {
            let shape = a.dims(symbols);
            match a.role {
                ArgRole::Input if a.name.starts_with('d') => safe_tensor(a.dtype, shape, seed + i),
                ArgRole::Input => edge_tensor(a.dtype, shape, seed + 3 * i),
                _ => Tensor::zeros(a.dtype, shape),
            }
        })
        .collect()
}

/// Every dtype, by name.
pub const DTYPE_NAMES: [&str; 9] = ["f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "bool"];

/// A graph casting its input `x` of dtype `from` (symbolic length `n`) to every dtype, one output each.
pub fn casts_graph(from: &str) -> String {
    let mut body = String::new();
    let mut outputs = String::new();
    for (i, to) in DTYPE_NAMES.iter().enumerate() {
        body.push_str(&format!("  %{} = cast %0 {{to={to}}} : {to}[n]\n", i + 1));
        outputs.push_str(&format!("  output \"to_{to}\" = %{}\n", i + 1));
    }
    format!("graph \"g\" {{\n  %0 = input {{name=\"x\"}} : {from}[n]\n{body}{outputs}}}")
}

/// `for i in 0..n { store y[i] = value }` over an input `x` and an output `y` of `dtype` (symbol `n`).
pub fn one_loop_kernel(name: &str, dtype: DType, value: kernel::Expr) -> Kernel {
    use kiln_codegen::kernel::{ArgId, Block, Extent, IExpr, KernelArg, LoopKind, LoopVar, Stmt};
    Kernel {
        name: name.into(),
        args: vec![
            KernelArg { name: "x".into(), dtype, shape: vec![Extent::Sym(0)], role: ArgRole::Input },
            KernelArg { name: "y".into(), dtype, shape: vec![Extent::Sym(0)], role: ArgRole::Output },
        ],
        symbols: vec!["n".into()],
        body: Block(vec![Stmt::For {
            var: LoopVar(0),
            extent: IExpr::Sym(0),
            kind: LoopKind::Vectorizable,
            body: Block(vec![Stmt::Store { arg: ArgId(1), index: IExpr::Var(LoopVar(0)), value }]),
        }]),
    }
}
