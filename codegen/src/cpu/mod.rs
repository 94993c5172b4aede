//! `codegen::cpu`: the Cranelift emitter for kernel IR — JIT-compiled code ([`JitModule`]), relocatable object
//! code ([`emit_object`]) and its text ([`disassemble`]).
//!
//! # ABI
//! Every kernel becomes one function of type [`KernelFn`]:
//! `extern "C" fn(args: *const *mut u8, syms: *const i64, part: i64, begin: i64, end: i64)`. `args` holds one
//! pointer per launch argument ([`Kernel::launch_args`] order: inputs and outputs, constants skipped) to dense
//! little-endian row-major data (f16/bf16 as their 16-bit patterns, bool as one byte 0 or 1; no alignment is
//! assumed); `syms` holds the symbol values in order. A call runs top-level part `part` (an unknown part does
//! nothing); for a parallel part it runs iterations `[begin, end)` of the part's outer loop, clamped to
//! `[0, extent)`, and for a serial part it ignores `begin`/`end`.
//!
//! # Parts
//! Each top-level `Parallel`/`Vectorizable` loop is a parallel part whose chunks may run concurrently and in
//! any order; each maximal run of other top-level statements is a serial part. Parts never communicate through
//! memory (a kernel IR invariant), so they may run in any order or concurrently. Top-level `Let`s and `Acc`s are
//! recomputed by each part that follows them. [`KernelInfo::parts`] describes them for the runtime.
//!
//! # Semantics
//! Scalar code matches `kiln_ir::interp::scalar` bit for bit: f16/bf16 compute in f32 and round after every
//! operation; float `min`/`max` propagate NaN and order -0 below +0; casts truncate and saturate (NaN → 0);
//! shifts by out-of-range amounts follow the interpreter; transcendental functions call the very functions the
//! interpreter uses (see [`runtime`]). Where the interpreter reports an error — integer division or remainder by
//! zero, a negative integer exponent — compiled code does not trap: the result is 0 (and `MIN / -1` wraps).
//!
//! Every dtype and kind the interpreter defines compiles (f16/bf16 included). A kind on a dtype the interpreter
//! rejects (`exp` on an integer, `add` on bool, `is_nan` on an integer, a sum of bools, ...) is
//! [`CpuError::Unsupported`] naming the kernel, the kind and the dtype; a kernel breaking an IR invariant (an
//! undefined or out-of-scope variable, mismatched dtypes, a store into an input) is [`CpuError::Malformed`].
//! Nothing panics on either.
//!
//! # Vectorization
//! A `Vectorizable` loop over f32 data runs four iterations at a time in f32x4 registers with a scalar tail
//! (see `simd` for which loops qualify and how loads and stores are formed); reduction loops stay scalar, so
//! reductions fold in the interpreter's order. Vector arithmetic, `sqrt`, `min`/`max`, comparisons and selects
//! are IEEE-exact; `exp`, `log`, `tanh`, `sigmoid` and `erf` use inline polynomials (see `vmath`) with relative
//! error below 2e-7 (`exp`, `log`) and 3e-7 (`tanh`, `sigmoid`, `erf`), falling back to the exact scalar
//! functions for a group of lanes holding NaN, infinities or values outside the polynomials' ranges; every other
//! kind (`pow`, `mod`, trigonometry, ...) computes lane by lane through the exact scalar path.
//!
//! No fused multiply-add is formed: the interpreter rounds products and sums separately, and so does this code.
//! Target features (AVX, FMA, SSE4.1, ...) come from host detection with [`CpuFeatures::Host`]; with
//! [`CpuFeatures::Baseline`] rounding instructions become runtime calls and vector `exp`, `log`, `tanh`,
//! `sigmoid` and `erf` go lane by lane.
//!
//! # Runtime functions
//! Transcendental math and the f16/bf16 conversions are Rust shims called through a table of pointers
//! ([`runtime::RUNTIME_TABLE_SYMBOL`]). The JIT fills it itself. An object file exports it zeroed; the loader of
//! the linked library must fill it with [`runtime::install_runtime_table`] before the first call.

mod emit;
pub(crate) mod parts;
pub use kiln_plan::cpu::runtime;
pub(crate) mod scalar;
mod simd;
mod target;
mod vmath;

use std::collections::HashMap;

use cranelift_codegen::ir::{AbiParam, Signature, types};
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{DataDescription, DataId, FuncId, Linkage, Module};

use crate::kernel::{ArgId, ArgRole, Kernel};
use emit::{Emitter, Target};
pub use kiln_plan::cpu::{CpuTarget, host_supports, host_triple};
use runtime::{RUNTIME_TABLE_LEN_SYMBOL, RUNTIME_TABLE_SYMBOL, RtFn};
pub use target::cpu_target;

pub use kiln_plan::cpu::{KernelFn, KernelInfo, PartInfo};

/// How hard Cranelift optimizes.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum OptLevel {
    /// No optimization: fastest compilation.
    None,
    /// Optimize for speed (the default).
    #[default]
    Speed,
    /// Optimize for speed and code size.
    SpeedAndSize,
}

/// Which instruction-set extensions the code may use.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum CpuFeatures {
    /// Everything the compiling machine supports (AVX, FMA, SSE4.1, ... as detected).
    #[default]
    Host,
    /// The architecture's baseline (x86-64: SSE2), for code that must run on other machines.
    Baseline,
}

/// Options of the CPU emitter.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuOptions {
    /// Optimization level.
    pub opt_level: OptLevel,
    /// Target features.
    pub features: CpuFeatures,
}

/// Errors of the CPU emitter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuError {
    /// The kernel uses an operation the emitter does not compile.
    #[error("kernel `{kernel}`: unsupported: {what}")]
    Unsupported {
        /// The kernel's name.
        kernel: String,
        /// What is not supported (an op on a dtype, ...).
        what: String,
    },
    /// The kernel breaks a kernel IR invariant (an undefined variable, mismatched dtypes, ...).
    #[error("kernel `{kernel}`: malformed: {message}")]
    Malformed {
        /// The kernel's name.
        kernel: String,
        /// What is wrong.
        message: String,
    },
    /// The host or requested target is not supported by Cranelift.
    #[error("target: {0}")]
    Target(String),
    /// Cranelift failed to compile a kernel (an emitter bug).
    #[error("kernel `{kernel}`: Cranelift: {message}")]
    Codegen {
        /// The kernel's name.
        kernel: String,
        /// Cranelift's message.
        message: String,
    },
    /// Building, linking or writing the module failed.
    #[error("module: {0}")]
    Module(String),
}

/// JIT-compiles kernels into executable memory; keeps the code alive as long as it lives (dropping it frees the
/// code, so no [`KernelFn`] taken from it may be called afterwards). `Send + Sync`: entries may be called from
/// any thread, concurrently.
pub struct JitModule {
    module: Option<cranelift_jit::JITModule>,
    entries: Vec<KernelFn>,
    infos: Vec<KernelInfo>,
}

// SAFETY: after `compile` finalizes the module it is never touched again until `Drop`; the entries are plain
// function pointers into immutable executable memory, which any thread may call.
unsafe impl Send for JitModule {}
// SAFETY: as for `Send`: shared access only reads `entries` and `infos`.
unsafe impl Sync for JitModule {}

impl std::fmt::Debug for JitModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JitModule").field("kernels", &self.infos).finish_non_exhaustive()
    }
}

impl JitModule {
    /// Compiles `kernels`; kernel `i` is then [`JitModule::entry`]`(i)`.
    pub fn compile(kernels: &[Kernel], options: &CpuOptions) -> Result<JitModule, CpuError> {
        let isa = make_isa(options, false)?;
        let target = target_of(&isa);
        let mut builder = cranelift_jit::JITBuilder::with_isa(isa, cranelift_module::default_libcall_names());
        for f in RtFn::ALL {
            builder.symbol(f.name(), f.address());
        }
        let mut module = cranelift_jit::JITModule::new(builder);
        let table = declare_table(&mut module, true)?;
        let mut ids = Vec::with_capacity(kernels.len());
        let mut infos = Vec::with_capacity(kernels.len());
        for (i, k) in kernels.iter().enumerate() {
            let (id, info, _) = define_kernel(&mut module, k, i, target, table, false)?;
            ids.push(id);
            infos.push(info);
        }
        module.finalize_definitions().map_err(|e| CpuError::Module(e.to_string()))?;
        let entries = ids
            .iter()
            .map(|&id| {
                let p = module.get_finalized_function(id);
                // SAFETY: `p` is the finalized code of a function declared with exactly `KernelFn`'s signature.
                unsafe { std::mem::transmute::<*const u8, KernelFn>(p) }
            })
            .collect();
        Ok(JitModule { module: Some(module), entries, infos })
    }

    /// The entry of kernel `i`, valid while this module lives. Panics if `i` is not below [`JitModule::len`].
    pub fn entry(&self, i: usize) -> KernelFn {
        self.entries[i]
    }

    /// What kernel `i` needs to be launched. Panics if `i` is not below [`JitModule::len`].
    pub fn info(&self, i: usize) -> &KernelInfo {
        &self.infos[i]
    }

    /// The number of kernels.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the module holds no kernel.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl Drop for JitModule {
    fn drop(&mut self) {
        if let Some(m) = self.module.take() {
            // SAFETY: the entries die with `self`; callers must not keep a `KernelFn` past the module, as documented
            // on `entry`'s owner type ("keeps the code alive as long as it lives").
            unsafe { m.free_memory() };
        }
    }
}

/// Object code (ELF, PIC) exporting one function per kernel named by [`KernelInfo::symbol`] and beside it the
/// digest of its launch facts ([`KernelInfo::facts_digest`], symbol `<symbol>__kiln_facts`), constants in
/// read-only data, and the runtime table ([`runtime::RUNTIME_TABLE_SYMBOL`], zeroed, to be filled by the loader
/// with [`runtime::install_runtime_table`]) with its length ([`runtime::RUNTIME_TABLE_LEN_SYMBOL`]).
pub fn emit_object(kernels: &[Kernel], options: &CpuOptions) -> Result<(Vec<u8>, Vec<KernelInfo>), CpuError> {
    let isa = make_isa(options, true)?;
    let target = target_of(&isa);
    let builder = cranelift_object::ObjectBuilder::new(isa, "kiln_kernels", cranelift_module::default_libcall_names())
        .map_err(|e| CpuError::Module(e.to_string()))?;
    let mut module = cranelift_object::ObjectModule::new(builder);
    let table = declare_table(&mut module, false)?;
    let mut infos = Vec::with_capacity(kernels.len());
    for (i, k) in kernels.iter().enumerate() {
        let info = define_kernel(&mut module, k, i, target, table, false)?.1;
        // The launch facts the code was compiled with, beside it (the loader checks the manifest's against them).
        let merr = |e: cranelift_module::ModuleError| CpuError::Module(format!("kernel `{}`: {e}", k.name));
        let facts = format!("{}{}", info.symbol, KernelInfo::FACTS_SUFFIX);
        let id = module.declare_data(&facts, Linkage::Export, false, false).map_err(merr)?;
        let mut desc = DataDescription::new();
        desc.define(info.facts_digest().to_vec().into_boxed_slice());
        module.define_data(id, &desc).map_err(merr)?;
        infos.push(info);
    }
    let bytes = module.finish().emit().map_err(|e| CpuError::Module(e.to_string()))?;
    Ok((bytes, infos))
}

/// Text of the code emitted for `kernel`: the Cranelift IR (clif) and, after it, the machine code as Cranelift's
/// VCode listing.
pub fn disassemble(kernel: &Kernel, options: &CpuOptions) -> Result<String, CpuError> {
    let isa = make_isa(options, true)?;
    let target = target_of(&isa);
    let builder = cranelift_object::ObjectBuilder::new(isa, "kiln_disasm", cranelift_module::default_libcall_names())
        .map_err(|e| CpuError::Module(e.to_string()))?;
    let mut module = cranelift_object::ObjectModule::new(builder);
    let table = declare_table(&mut module, false)?;
    let (_, _, text) = define_kernel(&mut module, kernel, 0, target, table, true)?;
    Ok(text)
}

fn make_isa(options: &CpuOptions, pic: bool) -> Result<OwnedTargetIsa, CpuError> {
    let mut flags = settings::builder();
    let opt = match options.opt_level {
        OptLevel::None => "none",
        OptLevel::Speed => "speed",
        OptLevel::SpeedAndSize => "speed_and_size",
    };
    let set = |flags: &mut settings::Builder, k: &str, v: &str| {
        flags.set(k, v).map_err(|e| CpuError::Target(format!("setting {k}={v}: {e}")))
    };
    set(&mut flags, "opt_level", opt)?;
    set(&mut flags, "enable_verifier", if cfg!(debug_assertions) { "true" } else { "false" })?;
    set(&mut flags, "is_pic", if pic { "true" } else { "false" })?;
    // JIT code may land anywhere in the address space relative to the runtime shims.
    set(&mut flags, "use_colocated_libcalls", "false")?;
    let isa_builder = match options.features {
        CpuFeatures::Host => cranelift_native::builder(),
        CpuFeatures::Baseline => cranelift_native::builder_with_options(false),
    }
    .map_err(|e| CpuError::Target(e.to_string()))?;
    isa_builder.finish(settings::Flags::new(flags)).map_err(|e| CpuError::Target(e.to_string()))
}

fn target_of(isa: &OwnedTargetIsa) -> Target {
    use target_lexicon::Architecture;
    let arch = isa.triple().architecture;
    let flag = |name: &str| isa.isa_flags().iter().any(|v| v.name == name && v.as_bool() == Some(true));
    let (simd, native_rounding, fused_multiply_add) = match arch {
        Architecture::X86_64 => (true, flag("has_sse41"), flag("has_fma")),
        Architecture::Aarch64(_) => (true, true, true),
        _ => (false, false, false),
    };
    Target {
        simd,
        native_rounding,
        fused_multiply_add,
        call_conv: isa.default_call_conv(),
        frontend: isa.frontend_config(),
    }
}

/// Declares (and defines) the runtime table: in the JIT filled with the shims' addresses, in object code zeroed
/// and exported along with its length.
fn declare_table<M: Module>(module: &mut M, jit: bool) -> Result<DataId, CpuError> {
    let merr = |e: cranelift_module::ModuleError| CpuError::Module(e.to_string());
    let n = RtFn::ALL.len();
    let linkage = if jit { Linkage::Local } else { Linkage::Export };
    let table = module.declare_data(RUNTIME_TABLE_SYMBOL, linkage, true, false).map_err(merr)?;
    let mut desc = DataDescription::new();
    desc.define_zeroinit(n * 8);
    desc.set_align(8);
    if jit {
        for (i, f) in RtFn::ALL.iter().enumerate() {
            let sig = runtime_signature(*f, module.isa().default_call_conv());
            let id = module.declare_function(f.name(), Linkage::Import, &sig).map_err(merr)?;
            let fref = module.declare_func_in_data(id, &mut desc);
            desc.write_function_addr((i * 8) as u32, fref);
        }
    }
    module.define_data(table, &desc).map_err(merr)?;
    if !jit {
        let len = module.declare_data(RUNTIME_TABLE_LEN_SYMBOL, Linkage::Export, false, false).map_err(merr)?;
        let mut desc = DataDescription::new();
        desc.define((n as u64).to_le_bytes().to_vec().into_boxed_slice());
        desc.set_align(8);
        module.define_data(len, &desc).map_err(merr)?;
    }
    Ok(table)
}

fn runtime_signature(f: RtFn, cc: cranelift_codegen::isa::CallConv) -> Signature {
    use runtime::RtSig;
    let (params, ret): (&[types::Type], types::Type) = match f.sig() {
        RtSig::F32ToF32 => (&[types::F32], types::F32),
        RtSig::F64ToF64 => (&[types::F64], types::F64),
        RtSig::F32F32ToF32 => (&[types::F32, types::F32], types::F32),
        RtSig::F64F64ToF64 => (&[types::F64, types::F64], types::F64),
        RtSig::I32ToF32 => (&[types::I32], types::F32),
        RtSig::F32ToI32 => (&[types::F32], types::I32),
        RtSig::F64ToF32 => (&[types::F64], types::F32),
        RtSig::I64ToF32 => (&[types::I64], types::F32),
        RtSig::I64I64ToI64 => (&[types::I64, types::I64], types::I64),
    };
    let mut s = Signature::new(cc);
    s.params.extend(params.iter().map(|&t| AbiParam::new(t)));
    s.returns.push(AbiParam::new(ret));
    s
}

/// The exported symbol of kernel `index`: `kiln_k<index>_` and the name with every other character than ASCII
/// letters, digits and `_` replaced by `_`.
fn symbol_name(kernel: &Kernel, index: usize) -> String {
    let clean: String =
        kernel.name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    format!("kiln_k{index}_{clean}")
}

/// Declares and defines kernel `index`'s function and constants; returns its id, its info and, when `text` is
/// set, its clif and VCode listing.
fn define_kernel<M: Module>(
    module: &mut M,
    kernel: &Kernel,
    index: usize,
    target: Target,
    table: DataId,
    text: bool,
) -> Result<(FuncId, KernelInfo, String), CpuError> {
    // The emitter works on verified kernels only (and does not check their invariants again).
    crate::kernel::verify_message(kernel)
        .map_err(|message| CpuError::Malformed { kernel: kernel.name.clone(), message })?;
    let merr = |e: cranelift_module::ModuleError| CpuError::Module(format!("kernel `{}`: {e}", kernel.name));
    let symbol = symbol_name(kernel, index);
    let mut consts: Vec<(ArgId, DataId)> = Vec::new();
    for (i, a) in kernel.args.iter().enumerate() {
        if let ArgRole::Constant(t) = &a.role {
            let id = module.declare_data(&format!("{symbol}.const{i}"), Linkage::Local, false, false).map_err(merr)?;
            let mut bytes = t.data().to_le_bytes();
            // An empty object is still given a byte, so every constant has an address.
            if bytes.is_empty() {
                bytes.push(0);
            }
            let mut desc = DataDescription::new();
            desc.define(bytes.into_boxed_slice());
            desc.set_align(16);
            module.define_data(id, &desc).map_err(merr)?;
            consts.push((ArgId(i as u32), id));
        }
    }
    let mut sig = Signature::new(module.isa().default_call_conv());
    for _ in 0..5 {
        sig.params.push(AbiParam::new(types::I64));
    }
    let func_id = module.declare_function(&symbol, Linkage::Export, &sig).map_err(merr)?;
    let mut ctx = module.make_context();
    ctx.func.signature = sig;
    let data: HashMap<ArgId, cranelift_codegen::ir::GlobalValue> =
        consts.iter().map(|&(a, id)| (a, module.declare_data_in_func(id, &mut ctx.func))).collect();
    let table_gv = module.declare_data_in_func(table, &mut ctx.func);
    let parts = parts::split(kernel);
    let mut fctx = FunctionBuilderContext::new();
    let b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
    Emitter::emit_kernel(kernel, b, target, &parts, &data, table_gv)?;
    let mut listing = String::new();
    if text {
        listing = ctx.func.display().to_string();
        ctx.set_disasm(true);
    }
    module.define_function(func_id, &mut ctx).map_err(|e| CpuError::Codegen {
        kernel: kernel.name.clone(),
        message: match &e {
            cranelift_module::ModuleError::Compilation(c) => format!("{c:?}"),
            other => other.to_string(),
        },
    })?;
    if text && let Some(vcode) = ctx.compiled_code().and_then(|c| c.vcode.clone()) {
        listing.push_str("\n; machine code (VCode)\n");
        listing.push_str(&vcode);
    }
    let info = KernelInfo {
        name: kernel.name.clone(),
        symbol,
        symbols: kernel.symbols.clone(),
        parts: parts.iter().map(parts::info).collect(),
        args: kernel.signature(),
    };
    Ok((func_id, info, listing))
}
