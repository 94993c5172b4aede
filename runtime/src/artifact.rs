//! Loading ahead-of-time artifacts without the compiler: the manifest (`kiln_plan::artifact`), checked; every
//! file's digest, checked before anything from it is used; the weights, checked against the program; and for a
//! CPU artifact the kernel library, linked from `kiln_codegen::cpu::emit_object`'s output and turned into
//! [`KernelCode::Native`].
//!
//! The library's runtime table must be filled before any kernel runs (see [`kiln_plan::cpu::runtime`]); the
//! loader checks that the library expects exactly as many entries as this build provides, so a library from a
//! build with a different table is refused instead of calling through a wrong pointer.

use std::path::Path;
use std::time::{Duration, Instant};

use kiln_ir::Dim;
use kiln_plan::artifact::{ArtifactError, ArtifactManifest, CpuManifest, FileDigest, artifact_error};
use kiln_plan::cpu::runtime::{RUNTIME_TABLE_LEN_SYMBOL, RUNTIME_TABLE_SYMBOL, install_runtime_table, runtime_table};
use kiln_plan::cpu::{KernelFn, KernelInfo, host_supports, host_triple};
use kiln_plan::exec::{Executable, Home};

use crate::RunError;
use crate::cpu::{CpuProgram, KernelCode};

/// Opens the kernel library at `path`, fills its runtime table and resolves every kernel of `infos` by its
/// symbol, checking that the launch facts the library records beside each kernel
/// ([`KernelInfo::facts_digest`]) are the manifest's. The library stays loaded as long as the returned code
/// lives.
///
/// # Safety
/// `path` must be a library produced by linking `kiln_codegen::cpu::emit_object`'s object for exactly these
/// `infos`: loading runs its initializers, and each symbol is called as a [`KernelFn`]. A library that merely
/// lacks a symbol or has a different table size is reported, not trusted.
pub unsafe fn load_kernel_library(path: &Path, infos: &[KernelInfo]) -> Result<KernelCode, RunError> {
    let fail = |message: String| RunError::Load { path: path.display().to_string(), message };
    // SAFETY: the caller vouches that the file is a kernel library, whose loading runs no code of its own.
    let library = unsafe { libloading::Library::new(path) }.map_err(|e| fail(format!("cannot load: {e}")))?;
    let expected = runtime_table().len() as u64;
    // SAFETY: `kiln_rt_table_len` is a `u64` in every kernel library (see `emit_object`).
    let len = unsafe { library.get::<*const u64>(RUNTIME_TABLE_LEN_SYMBOL.as_bytes()) }
        .map_err(|e| fail(format!("no `{RUNTIME_TABLE_LEN_SYMBOL}`: {e}")))?;
    // SAFETY: the symbol's address is that of the library's `u64`, alive while `library` is.
    let len = unsafe { (*len).read_unaligned() };
    if len != expected {
        return Err(fail(format!(
            "its runtime table has {len} entries but this kiln provides {expected}: recompile the artifact"
        )));
    }
    // SAFETY: `kiln_rt_table` is a writable array of pointers in every kernel library.
    let table = unsafe { library.get::<*mut *const u8>(RUNTIME_TABLE_SYMBOL.as_bytes()) }
        .map_err(|e| fail(format!("no `{RUNTIME_TABLE_SYMBOL}`: {e}")))?;
    // SAFETY: its length was checked above, and no kernel of the just-loaded library can be running.
    unsafe { install_runtime_table(*table) };
    let mut entries = Vec::with_capacity(infos.len());
    for info in infos {
        // SAFETY: every kernel symbol of a kernel library is a function of type `KernelFn`.
        let f = unsafe { library.get::<KernelFn>(info.symbol.as_bytes()) }
            .map_err(|e| fail(format!("kernel `{}`: no symbol `{}`: {e}", info.name, info.symbol)))?;
        let facts = format!("{}{}", info.symbol, KernelInfo::FACTS_SUFFIX);
        // SAFETY: every kernel of a kernel library has a 32-byte facts digest beside it (see `emit_object`).
        let recorded = unsafe { library.get::<*const [u8; 32]>(facts.as_bytes()) }
            .map_err(|e| fail(format!("kernel `{}`: no `{facts}`: {e}", info.name)))?;
        // SAFETY: the symbol's address is that of the library's 32 bytes, alive while `library` is.
        if unsafe { (*recorded).read_unaligned() } != info.facts_digest() {
            return Err(fail(format!(
                "kernel `{}`: the manifest's launch facts (symbol `{}`, parts, signature) are not those its code \
                 was compiled with (a crafted or mixed-up artifact): recompile the model",
                info.name, info.symbol
            )));
        }
        entries.push((*f, info.clone()));
    }
    Ok(KernelCode::Native { entries, owner: Box::new(library) })
}

impl From<ArtifactError> for RunError {
    fn from(e: ArtifactError) -> RunError {
        RunError::Load { path: e.path, message: e.message }
    }
}

/// Reads the artifact in `dir` ([`kiln_plan::artifact::read_manifest`]) and checks that this host can run it: a
/// CPU artifact's target triple and CPU features. (A CUDA artifact's device is checked when a device is opened.)
pub fn open(dir: &Path) -> Result<ArtifactManifest, RunError> {
    let manifest = kiln_plan::artifact::read_manifest(dir)?;
    if let ArtifactManifest::Cpu(m) = &manifest {
        let path = dir.join(kiln_plan::artifact::MANIFEST_FILE);
        let host = host_triple();
        if m.target.triple != host {
            return Err(artifact_error(
                &path,
                format!("compiled for target `{}`, but this host is `{host}`", m.target.triple),
            )
            .into());
        }
        let missing: Vec<&str> =
            m.target.cpu_features.iter().map(String::as_str).filter(|f| !host_supports(f)).collect();
        if !missing.is_empty() {
            return Err(artifact_error(
                &path,
                format!("compiled for CPU features this host lacks: {}", missing.join(", ")),
            )
            .into());
        }
    }
    Ok(manifest)
}

/// Reads the weight file an artifact's manifest names (its digest checked) into `exe`, and checks every weight
/// the program reads against its declared dtype and shape. Returns how long reading took.
pub fn load_weights(dir: &Path, digest: &FileDigest, exe: &mut Executable) -> Result<Duration, RunError> {
    let t0 = Instant::now();
    let bytes = ArtifactManifest::check_file(dir, digest)?;
    let path = dir.join(&digest.file);
    exe.weights = crate::weights::parse(&path, &bytes).map_err(|e| artifact_error(&path, e.message))?;
    check_weights(exe).map_err(|m| artifact_error(&path, m))?;
    Ok(t0.elapsed())
}

/// Every weight the program reads is present with the dtype and (static) extents its buffers declare.
pub fn check_weights(exe: &Executable) -> Result<(), String> {
    for info in &exe.buffers {
        let Home::Weight(name) = &info.home else { continue };
        let Some(t) = exe.weights.get(name) else {
            return Err(format!("weight `{name}` is missing (the program reads it as {})", info.ty));
        };
        let fits = t.shape().len() == info.ty.shape.rank()
            && info.ty.shape.0.iter().zip(t.shape()).all(|(d, &n)| match d {
                Dim::Static(k) => *k == n as u64,
                Dim::Sym(_) => true,
            });
        if t.dtype() != info.ty.dtype || !fits {
            return Err(format!(
                "weight `{name}` is {}{:?}, but the program reads it as {}",
                t.dtype(),
                t.shape(),
                info.ty
            ));
        }
    }
    Ok(())
}

/// A loaded CPU artifact: the program, bound to its code and weights, and what loading took.
pub struct LoadedCpu {
    /// The program.
    pub program: CpuProgram,
    /// The manifest (its executable moved into the program).
    pub manifest: CpuManifest,
    /// Wall time of reading the weights.
    pub weights_load: Duration,
}

/// Loads a CPU artifact that [`open`] returned, to run on `threads` workers: weights and kernel library, each
/// checked against the manifest's digest before use, and the backends its placement names, from `registry`.
/// Nothing from an artifact that fails a check runs.
pub fn load_cpu(
    dir: &Path,
    manifest: ArtifactManifest,
    threads: usize,
    registry: &crate::registry::BackendRegistry,
) -> Result<LoadedCpu, RunError> {
    let ArtifactManifest::Cpu(mut m) = manifest else {
        return Err(artifact_error(&dir.join(kiln_plan::artifact::MANIFEST_FILE), "not a CPU artifact").into());
    };
    let mut exe = std::mem::replace(&mut m.common.executable, Executable::empty(""));
    let weights_load = load_weights(dir, &m.common.weights, &mut exe)?;
    let library = kiln_plan::artifact::artifact_file(dir, &m.common.code.file)?;
    ArtifactManifest::check_file(dir, &m.common.code)?;
    // SAFETY: the library's digest matches the manifest, which `kiln compile` wrote beside the library it linked
    // for these kernels; its table size and symbols are checked as it loads.
    let code = unsafe { load_kernel_library(&library, &m.kernels) }?;
    let program = CpuProgram::with_backends(exe, code, threads, registry)?;
    tracing::info!(artifact = %dir.display(), kind = "cpu", kernels = m.kernels.len(), "artifact loaded");
    Ok(LoadedCpu { program, manifest: m, weights_load })
}

/// A loaded CUDA artifact: the program bound to the device, and what loading took.
pub struct LoadedCuda {
    /// The program on the device.
    pub program: crate::cuda::GpuProgram<crate::cuda::CudaGpu>,
    /// The manifest (its executable moved into the program).
    pub manifest: kiln_plan::artifact::CudaManifest,
    /// Wall time of reading the weights.
    pub weights_load: Duration,
}

/// Loads a CUDA artifact that [`open`] returned onto CUDA device `ordinal`: the device's compute capability is
/// checked against the artifact's architecture, the weights and the PTX module against their digests, and the
/// driver JIT-compiles the PTX (no LLVM here). The backends the placement names come from `registry`.
pub fn load_cuda(
    dir: &Path,
    manifest: ArtifactManifest,
    ordinal: usize,
    registry: &crate::registry::BackendRegistry,
) -> Result<LoadedCuda, RunError> {
    use kiln_plan::device::PtxArch;
    let path = dir.join(kiln_plan::artifact::MANIFEST_FILE);
    let ArtifactManifest::Cuda(mut m) = manifest else {
        return Err(artifact_error(&path, "not a CUDA artifact: it runs on the CPU").into());
    };
    let device = crate::cuda::CudaDevice::open(ordinal)?;
    if let Ok((major, minor)) = device.compute_capability() {
        let need = match m.target.arch {
            PtxArch::Sm80 => 8,
            PtxArch::Sm90 => 9,
        };
        if major < need {
            return Err(artifact_error(
                &path,
                format!(
                    "compiled for {}, but device {ordinal} ({}) has compute capability {major}.{minor}",
                    m.target.arch.name(),
                    device.name()
                ),
            )
            .into());
        }
    }
    let mut exe = std::mem::replace(&mut m.common.executable, Executable::empty(""));
    let weights_load = load_weights(dir, &m.common.weights, &mut exe)?;
    let ptx = ArtifactManifest::check_file(dir, &m.common.code)?;
    let ptx = String::from_utf8(ptx)
        .map_err(|_| artifact_error(&dir.join(&m.common.code.file), "the PTX module is not UTF-8 text"))?;
    let entries: Vec<String> = m.kernels.iter().map(|i| i.entry.clone()).collect();
    let gpu = crate::cuda::CudaGpu::new(device, &ptx, &entries)?;
    // The plan is small (steps and launch facts); the manifest keeps a copy for reports.
    let program = crate::cuda::GpuProgram::with_backends(
        std::sync::Arc::new(gpu),
        exe,
        m.plan.clone(),
        m.kernels.clone(),
        registry,
    )?;
    Ok(LoadedCuda { program, manifest: m, weights_load })
}
