//! Device plans: an executable's steps for an accelerator (what the CUDA backend runs), and the launch facts of
//! PTX kernels — everything a runtime needs, known without LLVM. `kiln_codegen::device` builds plans; its module
//! docs say how each library step becomes device steps.

use kiln_ir::{DType, Op};

use crate::exec::BufferId;
use crate::kernel::{IExpr, Kernel};

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
    /// The reference interpreter — or, when `backend` names one, that registry backend (the placement put the
    /// node there) — runs `op` on the host.
    Host {
        /// The registry backend, or `None` for the reference interpreter.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        backend: Option<String>,
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
    pub fallbacks: Vec<crate::exec::Fallback>,
}

impl DevicePlan {
    /// The nodes each registry backend runs ([`DeviceStep::Host`] steps with a backend), by backend name.
    pub fn placed_nodes(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        let mut out: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for s in self.prepare.iter().chain(&self.steps) {
            if let DeviceStep::Host { backend: Some(b), node, op, .. } = s {
                out.entry(b.clone()).or_default().push(format!("{} `{node}`", op.mnemonic()));
            }
        }
        out
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
    /// The launch signature: the type and role of each buffer parameter ([`crate::verify::LaunchArg`]; the
    /// program verifier checks every launch against it).
    pub args: Vec<crate::verify::LaunchArg>,
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
