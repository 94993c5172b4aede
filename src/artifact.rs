//! Ahead-of-time artifacts: a compiled model in a directory, loadable without generating code.
//!
//! [`Artifact::write`] takes a [`Lowered`] model (after its pass pipeline and lowering) and writes:
//! - `manifest.json` ([`Manifest`]): the format version, the kiln version, the target (triple and the CPU features
//!   the code was compiled for), the model's inputs and outputs, the executable (everything but its kernel IR and
//!   weights) with the launch facts of each kernel, and the names of the two files below;
//! - `weights.safetensors`: the weights of the optimized graph;
//! - `kernels.so`: the kernels as a shared library, Cranelift object code linked by the system `cc`.
//!
//! [`Artifact::write_cuda`] writes a CUDA artifact instead: a [`CudaManifest`] (target `nvptx64-nvidia-cuda`, the
//! GPU architecture, PTX ISA and block size, and each kernel's entry, parameters and launch rule), the same
//! weight file, and `kernels.ptx`. The CUDA runtime that loads it is not built yet: [`Artifact::open`] refuses a
//! CUDA artifact with an error that says so.
//!
//! [`Artifact::load`] reads the manifest, refuses an artifact of another format version, another target triple, or
//! one that needs a CPU feature this host lacks, then loads the weights and the library (no code generation) and
//! returns the same [`Compiled`] that [`crate::Model::compile`] does. A damaged manifest or weight file is an
//! [`Error`], never a panic. The manifest is written last, so an interrupted write leaves no loadable artifact.

use std::path::{Path, PathBuf};
use std::time::Instant;

use kiln_codegen::cpu::{self, CpuOptions, CpuTarget, KernelInfo};
use kiln_codegen::device::{DevicePlan, PtxArch, PtxKernelInfo};
use kiln_codegen::exec::Executable;
#[cfg(feature = "ptx")]
use kiln_codegen::ptx::PtxOptions;
use serde::{Deserialize, Serialize};

use crate::{Compiled, Error, Lowered};

/// The manifest format this kiln writes and reads; bumped on any incompatible change.
pub const FORMAT_VERSION: u32 = 1;

/// The manifest's file name inside an artifact directory.
pub const MANIFEST_FILE: &str = "manifest.json";

const WEIGHTS_FILE: &str = "weights.safetensors";
const LIBRARY_FILE: &str = "kernels.so";
/// The PTX module of a CUDA artifact, inside its directory.
pub const PTX_FILE: &str = "kernels.ptx";

/// The target triple of a CUDA artifact (`codegen::ptx::PTX_TRIPLE`, known here without the `ptx` feature so
/// that any kiln recognizes such an artifact).
const CUDA_TRIPLE: &str = "nvptx64-nvidia-cuda";

/// The target of a CUDA artifact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaTarget {
    /// `nvptx64-nvidia-cuda`.
    pub triple: String,
    /// The GPU architecture the PTX is for.
    pub arch: PtxArch,
    /// The PTX ISA version (`7.8`).
    pub ptx_isa: String,
    /// Threads per block of every launch.
    pub block_size: u32,
}

/// `manifest.json` of a CUDA artifact: as [`Manifest`], with the PTX module in place of the CPU library and the
/// device plan.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CudaManifest {
    /// [`FORMAT_VERSION`] of the kiln that wrote it.
    pub format_version: u32,
    /// The version of the kiln that wrote it.
    pub kiln_version: String,
    /// What device the code is for.
    pub target: CudaTarget,
    /// The model's inputs, in order.
    pub inputs: Vec<PortInfo>,
    /// The model's outputs, in order.
    pub outputs: Vec<PortInfo>,
    /// The weight file, relative to the artifact directory.
    pub weights_file: String,
    /// The PTX module, relative to the artifact directory.
    pub ptx_file: String,
    /// Entry, parameters and launch rule of each kernel, by the device plan's kernel index (the executable's
    /// kernels, then the builtins).
    pub kernels: Vec<PtxKernelInfo>,
    /// The executable without its kernel IR and weights.
    pub executable: Executable,
    /// The executable's steps for the device.
    pub plan: DevicePlan,
}

/// `manifest.json`: what an artifact holds. See the module docs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT_VERSION`] of the kiln that wrote it.
    pub format_version: u32,
    /// The version of the kiln that wrote it.
    pub kiln_version: String,
    /// What machine the code is for.
    pub target: CpuTarget,
    /// The model's inputs, in order.
    pub inputs: Vec<PortInfo>,
    /// The model's outputs, in order.
    pub outputs: Vec<PortInfo>,
    /// The weight file, relative to the artifact directory.
    pub weights_file: String,
    /// The kernel library, relative to the artifact directory.
    pub library_file: String,
    /// Launch facts of each kernel, by the executable's kernel index (symbol, symbols, parts).
    pub kernels: Vec<KernelInfo>,
    /// The executable without its kernel IR and weights.
    pub executable: Executable,
    /// Which weights are the model's parameters and which the compiler made, for `--weights` swaps (absent in
    /// artifacts written before it was recorded: then every weight is required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<crate::WeightProvenance>,
}

/// An input or output as the manifest lists it, for people and tools reading it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortInfo {
    /// Its name.
    pub name: String,
    /// Its dtype (`f32`, …).
    pub dtype: String,
    /// Its shape as `.kir` prints it (`[N,3,224,224]`).
    pub shape: String,
}

/// A compiled model on disk: its directory and manifest.
#[derive(Clone, Debug)]
pub struct Artifact {
    dir: PathBuf,
    manifest: Manifest,
}

fn artifact_error(path: &Path, message: impl Into<String>) -> Error {
    Error::Artifact { path: path.display().to_string(), message: message.into() }
}

impl Artifact {
    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Whether `path` looks like an artifact: a directory holding a manifest.
    pub fn is_artifact(path: &Path) -> bool {
        path.is_dir() && path.join(MANIFEST_FILE).is_file()
    }

    /// Writes `lowered` as an artifact into `dir` (created if missing): emits object code for the host CPU and
    /// links it with the system `cc`. Returns the artifact as written.
    pub fn write(lowered: &Lowered, dir: &Path) -> Result<Artifact, Error> {
        std::fs::create_dir_all(dir).map_err(|e| artifact_error(dir, format!("cannot create the directory: {e}")))?;
        let options = CpuOptions::default();
        let fail = |e: cpu::CpuError| Error::Backend { backend: "cpu", message: e.to_string() };
        let target = cpu::cpu_target(&options).map_err(fail)?;
        let exe = &lowered.executable;
        let (object, kernels) = cpu::emit_object(&exe.kernels, &options).map_err(fail)?;
        link_shared_library(&object, &dir.join(LIBRARY_FILE))?;
        crate::weights::save(&dir.join(WEIGHTS_FILE), &exe.weights)?;
        let (inputs, outputs) = ports(lowered);
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            kiln_version: env!("CARGO_PKG_VERSION").to_string(),
            target,
            inputs,
            outputs,
            weights_file: WEIGHTS_FILE.into(),
            library_file: LIBRARY_FILE.into(),
            kernels,
            executable: exe.clone(),
            provenance: Some(lowered.provenance.clone()),
        };
        let path = dir.join(MANIFEST_FILE);
        let text = serde_json::to_string_pretty(&manifest)
            .map_err(|e| artifact_error(&path, format!("cannot serialize the manifest: {e}")))?;
        std::fs::write(&path, text + "\n").map_err(|e| artifact_error(&path, format!("cannot write: {e}")))?;
        Ok(Artifact { dir: dir.to_path_buf(), manifest })
    }

    #[cfg(feature = "ptx")]
    /// Writes `lowered` as a CUDA artifact into `dir` (created if missing): the kernels compiled to PTX for
    /// `options.arch`, the weights, and a [`CudaManifest`], written last. Returns the manifest.
    pub fn write_cuda(lowered: &Lowered, dir: &Path, options: &PtxOptions) -> Result<CudaManifest, Error> {
        std::fs::create_dir_all(dir).map_err(|e| artifact_error(dir, format!("cannot create the directory: {e}")))?;
        let exe = &lowered.executable;
        let crate::cuda::DeviceCode { plan, module } = crate::cuda::compile_device(exe, options)?;
        let ptx_path = dir.join(PTX_FILE);
        std::fs::write(&ptx_path, &module.ptx).map_err(|e| artifact_error(&ptx_path, format!("cannot write: {e}")))?;
        crate::weights::save(&dir.join(WEIGHTS_FILE), &exe.weights)?;
        let (inputs, outputs) = ports(lowered);
        let manifest = CudaManifest {
            format_version: FORMAT_VERSION,
            kiln_version: env!("CARGO_PKG_VERSION").to_string(),
            target: CudaTarget {
                triple: CUDA_TRIPLE.into(),
                arch: options.arch,
                ptx_isa: "7.8".into(),
                block_size: options.block_size,
            },
            inputs,
            outputs,
            weights_file: WEIGHTS_FILE.into(),
            ptx_file: PTX_FILE.into(),
            kernels: module.kernels,
            executable: exe.clone(),
            plan,
        };
        let path = dir.join(MANIFEST_FILE);
        let text = serde_json::to_string_pretty(&manifest)
            .map_err(|e| artifact_error(&path, format!("cannot serialize the manifest: {e}")))?;
        std::fs::write(&path, text + "\n").map_err(|e| artifact_error(&path, format!("cannot write: {e}")))?;
        Ok(manifest)
    }

    /// Whether the artifact in `dir` is a CUDA artifact (an unreadable manifest is not one).
    pub fn is_cuda(dir: &Path) -> bool {
        read_manifest(dir).is_ok_and(|(_, v)| is_cuda_manifest(&v))
    }

    /// Reads and checks an artifact's manifest: its format version, target triple and CPU features must suit
    /// this kiln and this host.
    pub fn open(dir: &Path) -> Result<Artifact, Error> {
        let (path, value) = read_manifest(dir)?;
        if is_cuda_manifest(&value) {
            let arch = value.pointer("/target/arch").and_then(|a| a.as_str()).unwrap_or("?");
            return Err(artifact_error(
                &path,
                format!(
                    "a CUDA artifact (PTX for {arch}): it runs on a GPU (`kiln run`, `Artifact::load_cuda`); \
                     compile with `--target cpu` to run on this host's CPU"
                ),
            ));
        }
        let manifest: Manifest =
            serde_json::from_value(value).map_err(|e| artifact_error(&path, format!("corrupt manifest: {e}")))?;
        let host = cpu::host_triple();
        if manifest.target.triple != host {
            return Err(artifact_error(
                &path,
                format!("compiled for target `{}`, but this host is `{host}`", manifest.target.triple),
            ));
        }
        let missing: Vec<&str> =
            manifest.target.cpu_features.iter().map(String::as_str).filter(|f| !cpu::host_supports(f)).collect();
        if !missing.is_empty() {
            return Err(artifact_error(
                &path,
                format!("compiled for CPU features this host lacks: {}", missing.join(", ")),
            ));
        }
        manifest
            .executable
            .check_references(manifest.kernels.len())
            .map_err(|e| artifact_error(&path, format!("corrupt manifest: the executable is inconsistent: {e}")))?;
        Ok(Artifact { dir: dir.to_path_buf(), manifest })
    }

    /// Loads the artifact in `dir` to run with `threads` worker threads (0: all cores): [`Artifact::open`], then
    /// the weights and the kernel library. No code is generated.
    pub fn load(dir: &Path, threads: usize) -> Result<Compiled, Error> {
        let t0 = Instant::now();
        Artifact::open(dir)?.into_compiled(threads, t0)
    }

    /// Loads the CUDA artifact in `dir` onto CUDA device `ordinal`: the manifest (checked), the weights and the
    /// PTX module (JIT-compiled by the driver; no LLVM is needed). Without a device, the device's clear error.
    pub fn load_cuda(dir: &Path, ordinal: usize) -> Result<crate::cuda::CudaCompiled, Error> {
        let t0 = Instant::now();
        let (path, value) = read_manifest(dir)?;
        if !is_cuda_manifest(&value) {
            return Err(artifact_error(&path, "not a CUDA artifact: `kiln run` runs it on the CPU"));
        }
        let manifest: CudaManifest =
            serde_json::from_value(value).map_err(|e| artifact_error(&path, format!("corrupt manifest: {e}")))?;
        manifest
            .plan
            .check_references(manifest.executable.buffers.len(), manifest.kernels.len())
            .map_err(|e| artifact_error(&path, format!("corrupt manifest: the device plan is inconsistent: {e}")))?;
        let device = kiln_runtime::cuda::CudaDevice::open(ordinal).map_err(crate::cuda_run_error)?;
        if let Ok((major, minor)) = device.compute_capability() {
            let need = match manifest.target.arch {
                PtxArch::Sm80 => 8,
                PtxArch::Sm90 => 9,
            };
            if major < need {
                return Err(artifact_error(
                    &path,
                    format!(
                        "compiled for {}, but device {ordinal} ({}) has compute capability {major}.{minor}",
                        manifest.target.arch.name(),
                        device.name()
                    ),
                ));
            }
        }
        let CudaManifest { mut executable, kernels, weights_file, ptx_file, plan, .. } = manifest;
        let tw = Instant::now();
        executable.weights = crate::weights::load(&artifact_file(dir, &weights_file)?)?;
        let weights_load = tw.elapsed();
        let ptx_path = artifact_file(dir, &ptx_file)?;
        let ptx =
            std::fs::read_to_string(&ptx_path).map_err(|e| artifact_error(&ptx_path, format!("cannot read: {e}")))?;
        let report = crate::CompileReport {
            kernels: kernels.len(),
            steps: executable.step_counts(),
            fallbacks: executable.fallbacks.clone(),
            arena_bytes: executable.arena_bytes,
            weights_load,
            ..Default::default()
        };
        let mut compiled = crate::cuda::CudaCompiled::bind(device, executable, plan, &ptx, kernels, report)?;
        compiled.set_load_time(t0.elapsed());
        Ok(compiled)
    }

    fn into_compiled(self, threads: usize, t0: Instant) -> Result<Compiled, Error> {
        let Manifest { executable: mut exe, kernels, weights_file, library_file, provenance, .. } = self.manifest;
        let file = |name: &str| artifact_file(&self.dir, name);
        let tw = Instant::now();
        exe.weights = crate::weights::load(&file(&weights_file)?)?;
        let weights_load = tw.elapsed();
        let library = file(&library_file)?;
        if !library.is_file() {
            return Err(artifact_error(&library, "the kernel library is missing"));
        }
        // SAFETY: the library is the one `Artifact::write` linked for these kernels, as the manifest beside it
        // records; its table size and symbols are checked as it loads.
        let code = unsafe { kiln_runtime::artifact::load_kernel_library(&library, &kernels) }
            .map_err(|e| artifact_error(&library, e.to_string()))?;
        let inputs = exe.inputs.iter().map(|(n, b)| (n.clone(), exe.buffers[b.0 as usize].ty.clone())).collect();
        let report = crate::CompileReport {
            kernels: kernels.len(),
            steps: exe.step_counts(),
            fallbacks: exe.fallbacks.clone(),
            arena_bytes: exe.arena_bytes,
            ..Default::default()
        };
        let mut compiled = Compiled::new(exe, code, threads, report, inputs)?;
        compiled.provenance = provenance;
        compiled.report.load = t0.elapsed();
        compiled.report.weights_load = weights_load;
        Ok(compiled)
    }
}

/// The manifest of the artifact in `dir` as JSON, its format version checked (read first, on its own, so that a
/// manifest of another format is reported as such and not as whatever field it happens to lack).
fn read_manifest(dir: &Path) -> Result<(PathBuf, serde_json::Value), Error> {
    let path = dir.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| artifact_error(&path, format!("cannot read: {e}")))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| artifact_error(&path, format!("corrupt manifest (not valid JSON): {e}")))?;
    let version = value
        .get("format_version")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| artifact_error(&path, "no `format_version`: not a kiln artifact manifest"))?;
    if version != u64::from(FORMAT_VERSION) {
        return Err(artifact_error(
            &path,
            format!(
                "format version {version} is not supported: this kiln ({}) reads format version {FORMAT_VERSION}; \
                 recompile the model with `kiln compile`",
                env!("CARGO_PKG_VERSION")
            ),
        ));
    }
    Ok((path, value))
}

fn is_cuda_manifest(value: &serde_json::Value) -> bool {
    value.pointer("/target/triple").and_then(|t| t.as_str()) == Some(CUDA_TRIPLE)
}

/// The path of file `name` of the artifact in `dir`: the manifest names files inside the artifact only.
fn artifact_file(dir: &Path, name: &str) -> Result<PathBuf, Error> {
    let relative = Path::new(name);
    if relative.components().all(|c| matches!(c, std::path::Component::Normal(_))) {
        Ok(dir.join(relative))
    } else {
        Err(artifact_error(&dir.join(MANIFEST_FILE), format!("`{name}` is not a file of the artifact")))
    }
}

/// Links `object` into the shared library `out` with the system C compiler driver.
fn link_shared_library(object: &[u8], out: &Path) -> Result<(), Error> {
    let scratch = std::env::temp_dir().join(format!(
        "kiln-link-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&scratch).map_err(|e| artifact_error(&scratch, format!("cannot create: {e}")))?;
    let result = (|| {
        let obj = scratch.join("kernels.o");
        std::fs::write(&obj, object).map_err(|e| artifact_error(&obj, format!("cannot write: {e}")))?;
        let output =
            std::process::Command::new("cc").arg("-shared").arg("-o").arg(out).arg(&obj).output().map_err(|e| {
                artifact_error(
                    out,
                    if e.kind() == std::io::ErrorKind::NotFound {
                        "cannot link the kernel library: the C compiler driver `cc` is not on PATH (install gcc or \
                         clang)"
                            .to_string()
                    } else {
                        format!("cannot run `cc`: {e}")
                    },
                )
            })?;
        if !output.status.success() {
            return Err(artifact_error(
                out,
                format!("`cc -shared` failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim()),
            ));
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result
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
