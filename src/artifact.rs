//! Ahead-of-time artifacts: a compiled model in a directory, loadable without generating code.
//!
//! [`Artifact::write`] takes a [`Lowered`] model (after its pass pipeline and lowering) and writes the
//! `kiln_plan::artifact` layout: `weights.safetensors`, `kernels.so` (Cranelift object code linked by the C
//! compiler driver: `$CC`, else `cc`) and, last, `manifest.json` with the digests of both, so an interrupted
//! write leaves no loadable artifact. [`Artifact::write_cuda`] writes a CUDA artifact instead (`kernels.ptx` and
//! the device plan).
//!
//! Loading is the runtime's (`kiln_runtime::artifact`: manifest, digests, weights checked against the program,
//! then the code; no compiler involved); [`Artifact::load`] and [`Artifact::load_cuda`] wrap it into the same
//! [`Compiled`] the JIT gives.

use std::path::{Path, PathBuf};
use std::time::Instant;

use kiln_codegen::cpu::{self, CpuOptions};
#[cfg(feature = "ptx")]
use kiln_codegen::ptx::PtxOptions;
pub use kiln_plan::artifact::{
    ArtifactManifest, CpuManifest, CudaManifest, CudaTarget, FORMAT_VERSION, FileDigest, LIBRARY_FILE, MANIFEST_FILE,
    ManifestCommon, PTX_FILE, PlacementRecord, PortInfo, WEIGHTS_FILE,
};

use crate::{Compiled, Error, Lowered};

/// A compiled model on disk: its directory and manifest.
#[derive(Clone, Debug)]
pub struct Artifact {
    dir: PathBuf,
    manifest: ArtifactManifest,
}

fn artifact_error(path: &Path, message: impl Into<String>) -> Error {
    Error::Artifact { path: path.display().to_string(), message: message.into() }
}

impl From<kiln_plan::artifact::ArtifactError> for Error {
    fn from(e: kiln_plan::artifact::ArtifactError) -> Error {
        Error::Artifact { path: e.path, message: e.message }
    }
}

/// The digest record of file `name` inside `dir`, as just written.
fn digest_of(dir: &Path, name: &str) -> Result<FileDigest, Error> {
    let path = dir.join(name);
    let bytes = std::fs::read(&path).map_err(|e| artifact_error(&path, format!("cannot read back: {e}")))?;
    Ok(FileDigest { file: name.to_string(), blake3: kiln_plan::weights::digest(&bytes) })
}

impl Artifact {
    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manifest.
    pub fn manifest(&self) -> &ArtifactManifest {
        &self.manifest
    }

    /// Whether `path` looks like an artifact: a directory holding a manifest.
    pub fn is_artifact(path: &Path) -> bool {
        kiln_plan::artifact::is_artifact(path)
    }

    /// Writes `lowered` as an artifact into `dir` (created if missing): emits object code for the host CPU and
    /// links it with the C compiler driver. Returns the artifact as written.
    pub fn write(lowered: &Lowered, dir: &Path) -> Result<Artifact, Error> {
        let manifest = write_atomically(dir, |staging| Artifact::write_cpu_files(lowered, staging))?;
        Ok(Artifact { dir: dir.to_path_buf(), manifest })
    }

    fn write_cpu_files(lowered: &Lowered, dir: &Path) -> Result<ArtifactManifest, Error> {
        let options = CpuOptions::default();
        let fail = |e: cpu::CpuError| Error::Backend { backend: "cpu", message: e.to_string() };
        let target = cpu::cpu_target(&options).map_err(fail)?;
        let exe = &lowered.executable;
        let (object, kernels) = cpu::emit_object(&exe.kernels, &options).map_err(fail)?;
        link_shared_library(&object, &dir.join(LIBRARY_FILE))?;
        kiln_runtime::weights::save(&dir.join(WEIGHTS_FILE), &exe.weights)?;
        let mut manifest =
            ArtifactManifest::Cpu(CpuManifest { common: common(lowered, dir, LIBRARY_FILE)?, target, kernels });
        kiln_plan::artifact::write_manifest(dir, &mut manifest)?;
        Ok(manifest)
    }

    #[cfg(feature = "ptx")]
    /// Writes `lowered` as a CUDA artifact into `dir` (created if missing): the kernels compiled to PTX for
    /// `options.arch`, the weights, and a [`CudaManifest`], written last. Returns the manifest.
    pub fn write_cuda(lowered: &Lowered, dir: &Path, options: &PtxOptions) -> Result<CudaManifest, Error> {
        write_atomically(dir, |staging| Artifact::write_cuda_files(lowered, staging, options))
    }

    #[cfg(feature = "ptx")]
    fn write_cuda_files(lowered: &Lowered, dir: &Path, options: &PtxOptions) -> Result<CudaManifest, Error> {
        let exe = &lowered.executable;
        let crate::cuda::DeviceCode { plan, module } = crate::cuda::compile_device(lowered, options)?;
        let ptx_path = dir.join(PTX_FILE);
        std::fs::write(&ptx_path, &module.ptx).map_err(|e| artifact_error(&ptx_path, format!("cannot write: {e}")))?;
        kiln_runtime::weights::save(&dir.join(WEIGHTS_FILE), &exe.weights)?;
        let manifest = CudaManifest {
            common: common(lowered, dir, PTX_FILE)?,
            target: CudaTarget {
                triple: kiln_plan::artifact::CUDA_TRIPLE.into(),
                arch: options.arch,
                ptx_isa: "7.8".into(),
                block_size: options.block_size,
            },
            kernels: module.kernels,
            plan,
        };
        let mut sealed = ArtifactManifest::Cuda(manifest);
        kiln_plan::artifact::write_manifest(dir, &mut sealed)?;
        let ArtifactManifest::Cuda(manifest) = sealed else { unreachable!("built as a CUDA manifest above") };
        Ok(manifest)
    }

    /// Whether the artifact in `dir` is a CUDA artifact (an unreadable manifest is not one).
    pub fn is_cuda(dir: &Path) -> bool {
        matches!(kiln_plan::artifact::read_manifest(dir), Ok(ArtifactManifest::Cuda(_)))
    }

    /// Reads and checks an artifact's manifest: its format version, its program's consistency, and for a CPU
    /// artifact the target triple and CPU features against this host.
    pub fn open(dir: &Path) -> Result<Artifact, Error> {
        let manifest = kiln_runtime::artifact::open(dir).map_err(crate::run_error)?;
        Ok(Artifact { dir: dir.to_path_buf(), manifest })
    }

    /// Loads the CPU artifact in `dir` to run with `threads` worker threads (0: all cores): [`Artifact::open`],
    /// then the weights and the kernel library, each checked against the manifest's digest. No code is generated.
    pub fn load(dir: &Path, threads: usize) -> Result<Compiled, Error> {
        Artifact::load_with(dir, threads, &crate::BackendRegistry::with_defaults())
    }

    /// [`Artifact::load`], with the backends the artifact's placement names taken from `backends` (a plugin
    /// that took nodes when the artifact was compiled must be registered to run it).
    pub fn load_with(dir: &Path, threads: usize, backends: &crate::BackendRegistry) -> Result<Compiled, Error> {
        let t0 = Instant::now();
        let artifact = Artifact::open(dir)?;
        if let ArtifactManifest::Cuda(m) = &artifact.manifest {
            return Err(artifact_error(
                &dir.join(MANIFEST_FILE),
                format!(
                    "a CUDA artifact (PTX for {}): it runs on a GPU (`kiln run`, `Artifact::load_cuda`); \
                     compile with `--target cpu` to run on this host's CPU",
                    m.target.arch.name()
                ),
            ));
        }
        let loaded =
            kiln_runtime::artifact::load_cpu(dir, artifact.manifest, crate::resolve_threads(threads)?, backends)
                .map_err(crate::run_error)?;
        let exe = loaded.program.executable();
        let report = crate::CompileReport {
            kernels: loaded.manifest.kernels.len(),
            steps: exe.step_counts(),
            fallbacks: exe.fallbacks.clone(),
            arena_bytes: exe.arena_bytes,
            weights_load: loaded.weights_load,
            ..Default::default()
        };
        let mut compiled = Compiled::from_program(loaded.program, report);
        compiled.report.placement = loaded.manifest.common.placement.clone();
        compiled.provenance = Some(loaded.manifest.common.provenance);
        compiled.report.load = t0.elapsed();
        Ok(compiled)
    }

    /// Loads the CUDA artifact in `dir` onto CUDA device `ordinal`: the manifest (checked), the weights and the
    /// PTX module (JIT-compiled by the driver; no LLVM is needed). Without a device, the device's clear error.
    pub fn load_cuda(dir: &Path, ordinal: usize) -> Result<Compiled, Error> {
        Artifact::load_cuda_with(dir, ordinal, &crate::BackendRegistry::with_defaults())
    }

    /// [`Artifact::load_cuda`], with the backends the artifact's placement names taken from `backends`.
    pub fn load_cuda_with(dir: &Path, ordinal: usize, backends: &crate::BackendRegistry) -> Result<Compiled, Error> {
        let t0 = Instant::now();
        let manifest = kiln_plan::artifact::read_manifest(dir)?;
        if !matches!(manifest, ArtifactManifest::Cuda(_)) {
            return Err(artifact_error(&dir.join(MANIFEST_FILE), "not a CUDA artifact: `kiln run` runs it on the CPU"));
        }
        let loaded =
            kiln_runtime::artifact::load_cuda(dir, manifest, ordinal, backends).map_err(crate::cuda_run_error)?;
        let exe = loaded.program.executable();
        let report = crate::CompileReport {
            kernels: loaded.manifest.kernels.len(),
            steps: exe.step_counts(),
            // The device plan's: what runs on the host there (the executable's fallbacks and more).
            fallbacks: loaded.manifest.plan.fallbacks.clone(),
            arena_bytes: exe.arena_bytes,
            weights_load: loaded.weights_load,
            placement: loaded.manifest.common.placement.clone(),
            ..Default::default()
        };
        let mut compiled = Compiled::from_program(loaded.program, report);
        compiled.report.load = t0.elapsed();
        Ok(compiled)
    }
}

/// Links `object` into the shared library `out` with the C compiler driver: `$CC` when set (as build systems
/// honour it), else `cc`. The object goes to a fresh temporary directory, removed afterwards.
fn link_shared_library(object: &[u8], out: &Path) -> Result<(), Error> {
    let cc = std::env::var_os("CC").filter(|v| !v.is_empty()).unwrap_or_else(|| "cc".into());
    let shown = cc.to_string_lossy().into_owned();
    let scratch = tempfile::Builder::new()
        .prefix("kiln-link-")
        .tempdir()
        .map_err(|e| artifact_error(&std::env::temp_dir(), format!("cannot create a scratch directory: {e}")))?;
    let obj = scratch.path().join("kernels.o");
    std::fs::write(&obj, object).map_err(|e| artifact_error(&obj, format!("cannot write: {e}")))?;
    let output = std::process::Command::new(&cc).arg("-shared").arg("-o").arg(out).arg(&obj).output().map_err(|e| {
        artifact_error(
            out,
            if e.kind() == std::io::ErrorKind::NotFound {
                format!(
                    "cannot link the kernel library: the C compiler driver `{shown}` is not on PATH (install gcc or \
                     clang, or set CC)"
                )
            } else {
                format!("cannot run `{shown}`: {e}")
            },
        )
    })?;
    if !output.status.success() {
        return Err(artifact_error(
            out,
            format!("`{shown} -shared` failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim()),
        ));
    }
    Ok(())
}

/// What every manifest of `lowered` holds, with the digests of the weights and of the code file `code`
/// (both written into `dir` already).
fn common(lowered: &Lowered, dir: &Path, code: &str) -> Result<ManifestCommon, Error> {
    let (inputs, outputs) = ports(lowered);
    Ok(ManifestCommon {
        format_version: FORMAT_VERSION,
        kiln_version: env!("CARGO_PKG_VERSION").to_string(),
        inputs,
        outputs,
        weights: digest_of(dir, WEIGHTS_FILE)?,
        code: digest_of(dir, code)?,
        executable: lowered.executable.clone(),
        provenance: lowered.provenance.clone(),
        placement: lowered.placement.clone(),
        digest: String::new(),
    })
}

/// Writes an artifact into `dir` all at once: `write` fills a fresh staging directory beside it, which then
/// takes `dir`'s place. A failure (a compiler driver that is missing, a full disk) leaves no half-written
/// artifact, and an artifact already at `dir` stays until the new one is complete. `dir` must be missing, empty,
/// or an artifact: other files are never overwritten.
fn write_atomically<T>(dir: &Path, write: impl FnOnce(&Path) -> Result<T, Error>) -> Result<T, Error> {
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if dir.exists() {
        let empty = std::fs::read_dir(dir).map(|mut d| d.next().is_none()).unwrap_or(false);
        if !dir.is_dir() || !(empty || Artifact::is_artifact(dir)) {
            return Err(artifact_error(
                dir,
                "exists and is not an artifact (nor an empty directory): choose another output directory",
            ));
        }
    }
    std::fs::create_dir_all(parent).map_err(|e| artifact_error(parent, format!("cannot create the directory: {e}")))?;
    let staging = tempfile::Builder::new()
        .prefix(".kiln-artifact-")
        .tempdir_in(parent)
        .map_err(|e| artifact_error(parent, format!("cannot create a staging directory: {e}")))?;
    let out = write(staging.path())?;
    // The old artifact (or empty directory) moves aside, the new one takes its name, then the old one goes.
    let old = if dir.exists() {
        let aside = tempfile::Builder::new()
            .prefix(".kiln-old-artifact-")
            .tempdir_in(parent)
            .map_err(|e| artifact_error(parent, format!("cannot create a staging directory: {e}")))?;
        let target = aside.path().join("old");
        std::fs::rename(dir, &target).map_err(|e| artifact_error(dir, format!("cannot replace it: {e}")))?;
        Some(aside)
    } else {
        None
    };
    let staged = staging.keep();
    if let Err(e) = std::fs::rename(&staged, dir) {
        let _ = std::fs::remove_dir_all(&staged);
        return Err(artifact_error(dir, format!("cannot move the new artifact into place: {e}")));
    }
    drop(old);
    Ok(out)
}

/// The inputs and outputs of `lowered` as manifests list them.
fn ports(lowered: &Lowered) -> (Vec<PortInfo>, Vec<PortInfo>) {
    let exe = &lowered.executable;
    let port = |name: &str, ty: &kiln_ir::TensorType| PortInfo {
        name: name.to_string(),
        dtype: ty.dtype.name().to_string(),
        shape: ty.shape.to_string(),
    };
    let inputs = lowered.inputs.iter().map(|(n, t)| port(n, t)).collect();
    let outputs = exe.outputs.iter().map(|(n, b)| port(n, &exe.buffers[b.0 as usize].ty)).collect();
    (inputs, outputs)
}
