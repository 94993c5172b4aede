//! Executables for accelerators: what the CUDA backend runs.
//!
//! An [`Executable`]'s steps assume the CPU's native library for `matmul`, `conv`, `pool` and `gather`. A device
//! has a GEMM library (cuBLAS) and nothing else, so [`DevicePlan::build`] rewrites each library step into device
//! steps over the same buffers:
//! - `matmul` stays one [`DeviceStep::MatMul`]: a (strided, batched) GEMM whose layout comes from
//!   [`crate::library::batch_plan`] at run time, the same broadcasting rule the CPU follows;
//! - `conv` with one group becomes [`DeviceStep::Conv`]: the output pre-filled with the bias (a
//!   [`builtin::bias_fill`] kernel) or zeros, the im2col matrix of every image (a [`builtin::im2col`] kernel into
//!   a per-run scratch buffer; skipped for a 1×1, stride-1, unpadded conv, whose input already is that matrix),
//!   then one GEMM per batch of images accumulating into the output;
//! - a grouped conv (depthwise included) becomes a [`builtin::conv_direct`] kernel, `pool` a [`builtin::pool`]
//!   kernel, both plain [`DeviceStep::Kernel`]s;
//! - `gather` becomes [`DeviceStep::Gather`]: its indices are checked on the host first (an out-of-range index
//!   is an error, as in the interpreter, not a clamped read), then a [`builtin::gather`] kernel runs;
//! - an epilogue kernel follows its library step as a [`DeviceStep::Kernel`];
//! - an interpreter fallback becomes [`DeviceStep::Host`]: its operands are copied to the host, the reference
//!   interpreter runs, its results are copied back.
//!
//! The builtin kernels are appended to the executable's kernels ([`DevicePlan::kernels`]: the executable's
//! first, at their own indices), so one PTX module holds them all and the emulator checks them as it checks any
//! other kernel. Identical builtins (same text) are built once.

use std::collections::HashMap;

use kiln_ir::op::{Conv, Op};
use kiln_ir::{DType, TensorType};

use crate::exec::{BufferId, Executable, LibraryOp, Step};
use crate::kernel::{self, IExpr, Kernel, LowerError, builtin};

/// One step of a device run. Buffers are the executable's.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum DeviceStep {
    /// Launch kernel `kernel` of [`DevicePlan::kernels`] with these buffers, one per launch argument.
    Kernel {
        /// Index into [`DevicePlan::kernels`].
        kernel: usize,
        /// The launch arguments.
        args: Vec<BufferId>,
    },
    /// `out = a · b` on f32 (numpy matmul semantics) through the device's GEMM.
    MatMul {
        /// Left operand.
        a: BufferId,
        /// Right operand.
        b: BufferId,
        /// Result.
        out: BufferId,
    },
    /// A one-group f32 convolution as im2col and GEMM (see the module docs).
    Conv {
        /// Input `[N, Cin, spatial…]`.
        x: BufferId,
        /// Weights `[Cout, Cin, window…]`.
        w: BufferId,
        /// Bias `[Cout]`, with the kernel writing it into the output.
        bias: Option<(BufferId, usize)>,
        /// Output `[N, Cout, out spatial…]`.
        out: BufferId,
        /// The im2col kernel (args `[x, col]`), or `None` when the input is its own im2col matrix.
        im2col: Option<usize>,
    },
    /// `gather`: the indices are checked against the data's axis on the host, then the kernel (args `[data,
    /// indices, out]`) runs.
    Gather {
        /// The gather kernel.
        kernel: usize,
        /// The data.
        data: BufferId,
        /// The indices (i32 or i64).
        indices: BufferId,
        /// The result.
        out: BufferId,
        /// The axis of the data the indices select along (normalized: non-negative).
        axis: usize,
    },
    /// Copy all of `src` to `dst`.
    Copy {
        /// Source.
        src: BufferId,
        /// Destination.
        dst: BufferId,
    },
    /// The reference interpreter runs `op` on the host.
    Host {
        /// The op.
        op: Op,
        /// Its operands.
        inputs: Vec<BufferId>,
        /// Its results.
        outputs: Vec<BufferId>,
        /// The node, for messages.
        node: String,
    },
}

/// An executable's steps for a device. See the module docs.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct DevicePlan {
    /// Steps run once when the weights are bound (from [`Executable::prepare`]).
    pub prepare: Vec<DeviceStep>,
    /// The steps of a run.
    pub steps: Vec<DeviceStep>,
    /// The executable's kernels, then the builtins. Not serialized: an artifact carries them as PTX.
    #[serde(skip)]
    pub kernels: Vec<Kernel>,
    /// Host fallbacks, as the executable names them.
    pub fallbacks: Vec<String>,
}

impl DevicePlan {
    /// The device plan of `exe` (which keeps its kernels: they come first in [`DevicePlan::kernels`]).
    pub fn build(exe: &Executable) -> Result<DevicePlan, LowerError> {
        let mut b = PlanBuilder { exe, kernels: exe.kernels.clone(), index: HashMap::new() };
        let prepare = b.steps(&exe.prepare)?;
        let steps = b.steps(&exe.steps)?;
        Ok(DevicePlan { prepare, steps, kernels: b.kernels, fallbacks: exe.fallbacks.clone() })
    }

    /// Checks that every step names buffers below `buffers` and kernels below `kernels` (a plan read from a
    /// damaged manifest is refused, not run).
    pub fn check_references(&self, buffers: usize, kernels: usize) -> Result<(), String> {
        let buffer = |b: &BufferId| {
            if (b.0 as usize) < buffers { Ok(()) } else { Err(format!("a step refers to buffer {} of {buffers}", b.0)) }
        };
        let kernel = |k: &usize| {
            if *k < kernels { Ok(()) } else { Err(format!("a step launches kernel {k} of {kernels}")) }
        };
        for s in self.prepare.iter().chain(&self.steps) {
            match s {
                DeviceStep::Kernel { kernel: k, args } => {
                    kernel(k)?;
                    args.iter().try_for_each(buffer)?;
                }
                DeviceStep::MatMul { a, b, out } => [a, b, out].into_iter().try_for_each(buffer)?,
                DeviceStep::Conv { x, w, bias, out, im2col } => {
                    [x, w, out].into_iter().try_for_each(buffer)?;
                    if let Some((b, k)) = bias {
                        buffer(b)?;
                        kernel(k)?;
                    }
                    im2col.iter().try_for_each(kernel)?;
                }
                DeviceStep::Gather { kernel: k, data, indices, out, .. } => {
                    kernel(k)?;
                    [data, indices, out].into_iter().try_for_each(buffer)?;
                }
                DeviceStep::Copy { src, dst } => [src, dst].into_iter().try_for_each(buffer)?,
                DeviceStep::Host { inputs, outputs, .. } => inputs.iter().chain(outputs).try_for_each(buffer)?,
            }
        }
        Ok(())
    }
}

/// The GEMM of a one-group convolution, per image: `out[Cout, P] (+)= w[Cout, K] · col[K, P]`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ConvGemm {
    /// Output channels (GEMM rows).
    pub cout: usize,
    /// `Cin · ∏window` (the contraction).
    pub k: usize,
    /// Output positions per image (GEMM columns).
    pub p: usize,
}

/// The per-image GEMM of a one-group conv with input, weight and output dims `xd`, `wd`, `od` (`None` when the
/// ranks do not fit a convolution).
pub fn conv_gemm_shape(xd: &[usize], wd: &[usize], od: &[usize]) -> Option<ConvGemm> {
    if xd.len() < 3 || wd.len() != xd.len() || od.len() != xd.len() {
        return None;
    }
    Some(ConvGemm { cout: wd[0], k: wd[1..].iter().product(), p: od[2..].iter().product() })
}

/// The im2col matrix `[N, Cin·∏window, ∏out spatial]` of a conv of `x` by `w` into `out`.
fn im2col_type(x: &TensorType, w: &TensorType, out: &TensorType) -> Result<TensorType, LowerError> {
    let product = |dims: &[kiln_ir::Dim]| -> Result<kiln_ir::Dim, LowerError> {
        let sizes: Option<Vec<u64>> = dims.iter().map(kiln_ir::Dim::as_static).collect();
        sizes.map(|s| kiln_ir::Dim::Static(s.iter().product())).ok_or_else(|| LowerError::NotLowerable {
            node: "conv".into(),
            reason: format!("the CUDA backend needs static channels and spatial dims, got {x} by {w}"),
        })
    };
    let (rows, cols) = (product(&w.shape.0[1..])?, product(out.shape.0.get(2..).unwrap_or_default())?);
    Ok(TensorType::new(x.dtype, kiln_ir::Shape(vec![x.shape.0[0].clone(), rows, cols])))
}

/// Whether a convolution reads its input as its own im2col matrix: a 1×1 window, stride 1, no padding.
fn is_pointwise(conv: &Conv, w: &TensorType) -> bool {
    let window_one = w.shape.0[2..].iter().all(|d| d.as_static() == Some(1));
    window_one && conv.strides.iter().all(|&s| s == 1) && conv.pads.iter().all(|&p| p == 0)
}

struct PlanBuilder<'e> {
    exe: &'e Executable,
    kernels: Vec<Kernel>,
    /// Builtin kernel text (name blanked) → index.
    index: HashMap<String, usize>,
}

impl PlanBuilder<'_> {
    fn ty(&self, b: BufferId) -> &TensorType {
        &self.exe.buffers[b.0 as usize].ty
    }

    /// Adds a builtin kernel (or finds its twin) and returns its index.
    fn builtin(&mut self, mut k: Kernel) -> usize {
        let key = kernel::print(&Kernel { name: String::new(), ..k.clone() });
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        k.name = format!("{}_{}", k.name, self.kernels.len());
        self.kernels.push(k);
        self.index.insert(key, self.kernels.len() - 1);
        self.kernels.len() - 1
    }

    fn steps(&mut self, steps: &[Step]) -> Result<Vec<DeviceStep>, LowerError> {
        let mut out = Vec::with_capacity(steps.len());
        for s in steps {
            self.step(s, &mut out)?;
        }
        Ok(out)
    }

    fn step(&mut self, s: &Step, out: &mut Vec<DeviceStep>) -> Result<(), LowerError> {
        match s {
            Step::Kernel { kernel, args } => out.push(DeviceStep::Kernel { kernel: *kernel, args: args.clone() }),
            Step::Copy { src, dst } => out.push(DeviceStep::Copy { src: *src, dst: *dst }),
            Step::Interp { op, inputs, outputs, node } => out.push(DeviceStep::Host {
                op: op.clone(),
                inputs: inputs.clone(),
                outputs: outputs.clone(),
                node: node.clone(),
            }),
            Step::Library { op, inputs, output, epilogue } => {
                out.push(self.library(op, inputs, *output)?);
                if let Some(e) = epilogue {
                    self.step(e, out)?;
                }
            }
        }
        Ok(())
    }

    fn library(&mut self, op: &LibraryOp, inputs: &[BufferId], output: BufferId) -> Result<DeviceStep, LowerError> {
        let out_ty = self.ty(output).clone();
        match op {
            LibraryOp::MatMul => Ok(DeviceStep::MatMul { a: inputs[0], b: inputs[1], out: output }),
            LibraryOp::Conv(c) => {
                let (x, w, bias) = (inputs[0], inputs[1], inputs.get(2).copied());
                let (xt, wt) = (self.ty(x).clone(), self.ty(w).clone());
                let bias_ty = bias.map(|b| self.ty(b).clone());
                if c.groups != 1 {
                    let k = builtin::conv_direct("conv_direct", &xt, &wt, bias_ty.as_ref(), c, &out_ty)?;
                    let args = [x, w].into_iter().chain(bias).chain([output]).collect();
                    return Ok(DeviceStep::Kernel { kernel: self.builtin(k), args });
                }
                let bias = match (bias, &bias_ty) {
                    (Some(b), Some(bt)) => Some((b, self.builtin(builtin::bias_fill("bias_fill", bt, &out_ty)?))),
                    _ => None,
                };
                let im2col = if is_pointwise(c, &wt) {
                    None
                } else {
                    let col = im2col_type(&xt, &wt, &out_ty)?;
                    Some(self.builtin(builtin::im2col("im2col", &xt, &wt, c, &col)?))
                };
                Ok(DeviceStep::Conv { x, w, bias, out: output, im2col })
            }
            LibraryOp::Pool(p) => {
                let k = builtin::pool("pool", self.ty(inputs[0]), p, &out_ty)?;
                Ok(DeviceStep::Kernel { kernel: self.builtin(k), args: vec![inputs[0], output] })
            }
            LibraryOp::Gather(g) => {
                let (data, indices) = (inputs[0], inputs[1]);
                let rank = self.ty(data).shape.rank();
                let axis = kiln_ir::types::normalize_axis(g.axis, rank)
                    .map_err(|reason| LowerError::NotLowerable { node: "gather".into(), reason })?;
                let k = builtin::gather("gather", self.ty(data), self.ty(indices), g, &out_ty)?;
                Ok(DeviceStep::Gather { kernel: self.builtin(k), data, indices, out: output, axis })
            }
        }
    }
}

// What a runtime needs to launch kernels compiled for a GPU, known without LLVM (a runtime-only build reads it
// from an artifact's manifest); `ptx` re-exports it.

/// The GPU architecture PTX is generated for.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum PtxArch {
    /// Ampere (A100): `sm_80`.
    #[default]
    #[serde(rename = "sm_80")]
    Sm80,
    /// Hopper (H100, H200): `sm_90`.
    #[serde(rename = "sm_90")]
    Sm90,
}

impl PtxArch {
    /// The LLVM CPU name and `ptxas -arch` value: `sm_80` or `sm_90`.
    pub fn name(self) -> &'static str {
        match self {
            PtxArch::Sm80 => "sm_80",
            PtxArch::Sm90 => "sm_90",
        }
    }

    /// Every architecture the emitter targets.
    pub const ALL: [PtxArch; 2] = [PtxArch::Sm80, PtxArch::Sm90];
}

impl std::str::FromStr for PtxArch {
    type Err = String;
    fn from_str(s: &str) -> Result<PtxArch, String> {
        PtxArch::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| format!("unknown GPU architecture `{s}` (expected sm_80 or sm_90)"))
    }
}

/// The default threads per block.
pub const DEFAULT_BLOCK_SIZE: u32 = 256;

/// The most blocks a launch uses: grid-stride loops cover larger iteration spaces.
pub const MAX_BLOCKS: u32 = 65_535;

/// A parameter of an entry, in order.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum PtxParam {
    /// A launch buffer: a global pointer to its first element.
    Buffer {
        /// The kernel argument (its position in [`Kernel::args`]).
        arg: u32,
        /// Its name.
        name: String,
        /// Its element type.
        dtype: DType,
    },
    /// A kernel symbol's value, as i64.
    Symbol {
        /// Its position in [`Kernel::symbols`].
        index: usize,
        /// Its name.
        name: String,
    },
}

/// What a runtime needs to launch one entry.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PtxKernelInfo {
    /// The entry's name in the PTX module.
    pub entry: String,
    /// The kernel's name.
    pub kernel: String,
    /// The parameters, in order.
    pub params: Vec<PtxParam>,
    /// Threads per block (the x dimension; y and z are 1).
    pub block_size: u32,
    /// Threads each part wants (the flattened trip count of a parallel part — times 32 for one that runs a
    /// row per warp —, 1 for a serial one), over the kernel's symbols.
    pub work: Vec<IExpr>,
    /// Whether some part reduces cooperatively (a row per warp with warp shuffles, or a block with shared
    /// memory and barriers): the threads of a block must run together, as they do on a GPU (the emulator then
    /// runs them concurrently).
    pub cooperative: bool,
}

impl PtxKernelInfo {
    /// The launch geometry rule: `(blocks, threads per block)`, with `blocks = clamp(ceil(max work / block
    /// size), 1, MAX_BLOCKS)`; any grid is correct (the loops are grid-stride), this one gives every work item
    /// its own thread up to the cap.
    pub fn launch_geometry(&self, symbols: &[i64]) -> Result<(u32, u32), String> {
        let mut most = 1i64;
        for w in &self.work {
            most = most.max(w.eval(&|_| None, symbols)?);
        }
        let blocks = (most as u64).div_ceil(u64::from(self.block_size)).clamp(1, u64::from(MAX_BLOCKS));
        Ok((blocks as u32, self.block_size))
    }
}
