//! The artifact manifest: what an ahead-of-time artifact directory holds, as the compiler writes it and any
//! runtime reads it.
//!
//! An artifact is a directory with `manifest.json` ([`ArtifactManifest`]), `weights.safetensors` and the code:
//! `kernels.so` (CPU: Cranelift object code linked as a shared library) or `kernels.ptx` (CUDA). The manifest
//! says what it is (`"kind": "cpu"` or `"cuda"`), the format version, the target, the model's inputs and
//! outputs, the program (the [`Executable`] without its kernel IR and weights, and for CUDA the device plan),
//! the launch facts of every kernel, and the BLAKE3 digest of every other file of the artifact, so a loader can
//! refuse a tampered or mixed-up file before anything from it is loaded ([`ArtifactManifest::check_file`]).
//!
//! [`read_manifest`] reads the format version on its own first, so a manifest of another format is reported as
//! such and not as whatever field it happens to lack.

use std::path::{Component, Path, PathBuf};

use crate::cpu::{CpuTarget, KernelInfo};
use crate::device::{DevicePlan, PtxArch, PtxKernelInfo};
use crate::exec::Executable;
use crate::verify::{LaunchArg, verify_device_plan, verify_executable};
use crate::weights::WeightProvenance;

/// The manifest format this kiln writes and reads; bumped on any incompatible change.
pub const FORMAT_VERSION: u32 = 3;

/// The manifest's file name inside an artifact directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The weight file of an artifact, inside its directory.
pub const WEIGHTS_FILE: &str = "weights.safetensors";
/// The kernel library of a CPU artifact, inside its directory.
pub const LIBRARY_FILE: &str = "kernels.so";
/// The PTX module of a CUDA artifact, inside its directory.
pub const PTX_FILE: &str = "kernels.ptx";
/// The target triple of CUDA code.
pub const CUDA_TRIPLE: &str = "nvptx64-nvidia-cuda";

/// An artifact that cannot be used: the file and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("artifact {path}: {message}")]
pub struct ArtifactError {
    /// The artifact directory or the file in it.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// An [`ArtifactError`] about `path`.
pub fn artifact_error(path: &Path, message: impl Into<String>) -> ArtifactError {
    ArtifactError { path: path.display().to_string(), message: message.into() }
}

/// The target of a CUDA artifact.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

/// An input or output as the manifest lists it, for people and tools reading it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PortInfo {
    /// Its name.
    pub name: String,
    /// Its dtype (`f32`, …).
    pub dtype: String,
    /// Its shape as `.kir` prints it (`[N,3,224,224]`).
    pub shape: String,
}

/// A file of the artifact and its digest.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileDigest {
    /// The file, relative to the artifact directory.
    pub file: String,
    /// BLAKE3 of its bytes, lower-case hex.
    pub blake3: String,
}

/// What every artifact's manifest holds, whatever its kind.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ManifestCommon {
    /// [`FORMAT_VERSION`] of the kiln that wrote it.
    pub format_version: u32,
    /// The version of the kiln that wrote it.
    pub kiln_version: String,
    /// The model's inputs, in order.
    pub inputs: Vec<PortInfo>,
    /// The model's outputs, in order.
    pub outputs: Vec<PortInfo>,
    /// The weight file.
    pub weights: FileDigest,
    /// The code: the kernel library (CPU) or the PTX module (CUDA).
    pub code: FileDigest,
    /// The program without its kernel IR and weights.
    pub executable: Executable,
    /// Which weights are the model's parameters and which the compiler made, for `--weights` swaps.
    pub provenance: WeightProvenance,
    /// Where each node that does not run as compiled code was placed when the artifact was compiled: backend
    /// name → the nodes it runs (`kiln inspect --placement`). Loading checks that every backend named here is
    /// registered.
    #[serde(default)]
    pub placement: Vec<PlacementRecord>,
    /// BLAKE3 of the manifest's canonical JSON with this field empty ([`seal`]): a manifest changed after
    /// `kiln compile` wrote it — a step, a symbol, a digest of another file — is refused.
    #[serde(default)]
    pub digest: String,
}

/// One backend's share of a compiled model, as recorded at compile time.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PlacementRecord {
    /// The registered backend name.
    pub backend: String,
    /// Its priority when it was chosen.
    pub priority: i32,
    /// The nodes it runs, as the graph describes them.
    pub nodes: Vec<String>,
}

/// `manifest.json` of a CPU artifact.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CpuManifest {
    /// What every manifest holds.
    #[serde(flatten)]
    pub common: ManifestCommon,
    /// What machine the code is for.
    pub target: CpuTarget,
    /// Launch facts of each kernel, by the executable's kernel index (symbol, symbols, parts).
    pub kernels: Vec<KernelInfo>,
}

/// `manifest.json` of a CUDA artifact.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CudaManifest {
    /// What every manifest holds.
    #[serde(flatten)]
    pub common: ManifestCommon,
    /// What device the code is for.
    pub target: CudaTarget,
    /// Entry, parameters and launch rule of each kernel, by the device plan's kernel index (the executable's
    /// kernels, then the builtins).
    pub kernels: Vec<PtxKernelInfo>,
    /// The executable's steps for the device.
    pub plan: DevicePlan,
}

/// `manifest.json`: what an artifact is and holds. See the module docs.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ArtifactManifest {
    /// Native code for a CPU.
    Cpu(CpuManifest),
    /// PTX for an NVIDIA GPU.
    Cuda(CudaManifest),
}

impl ArtifactManifest {
    /// What every manifest holds.
    pub fn common(&self) -> &ManifestCommon {
        match self {
            ArtifactManifest::Cpu(m) => &m.common,
            ArtifactManifest::Cuda(m) => &m.common,
        }
    }

    fn common_mut(&mut self) -> &mut ManifestCommon {
        match self {
            ArtifactManifest::Cpu(m) => &mut m.common,
            ArtifactManifest::Cuda(m) => &mut m.common,
        }
    }

    /// The digest [`seal`] records: BLAKE3 of the canonical JSON (serde's field order, no whitespace) of this
    /// manifest with its `digest` empty.
    pub fn canonical_digest(&self) -> String {
        let mut blank = self.clone();
        blank.common_mut().digest.clear();
        let text = serde_json::to_string(&blank).expect("a manifest serializes");
        crate::weights::digest(text.as_bytes())
    }

    /// `cpu` or `cuda`.
    pub fn kind(&self) -> &'static str {
        match self {
            ArtifactManifest::Cpu(_) => "cpu",
            ArtifactManifest::Cuda(_) => "cuda",
        }
    }

    /// Checks the program as the compiler checks its own output ([`crate::verify`]: references, arities and
    /// types against every kernel's recorded launch signature, who writes what, definition before use, aliasing),
    /// and that the declared inputs and outputs are the program's.
    pub fn check_program(&self) -> Result<(), String> {
        let common = self.common();
        let exe = &common.executable;
        match self {
            ArtifactManifest::Cpu(m) => {
                let sigs: Vec<&[LaunchArg]> = m.kernels.iter().map(|k| k.args.as_slice()).collect();
                verify_executable(exe, &sigs).map_err(|e| format!("the program does not verify: {e}"))?;
            }
            ArtifactManifest::Cuda(m) => {
                let sigs: Vec<&[LaunchArg]> = m.kernels.iter().map(|k| k.args.as_slice()).collect();
                verify_device_plan(exe, &m.plan, &sigs).map_err(|e| format!("the device plan does not verify: {e}"))?;
            }
        }
        let names = |ports: &[PortInfo]| ports.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        let exe_names = |v: &[(String, crate::exec::BufferId)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        if names(&common.inputs) != exe_names(&exe.inputs) {
            return Err("the declared inputs are not the program's".into());
        }
        if names(&common.outputs) != exe_names(&exe.outputs) {
            return Err("the declared outputs are not the program's".into());
        }
        Ok(())
    }

    /// What `inspect` prints about the artifact in `dir`: kind, target and writer; inputs and outputs; step
    /// counts and arena; placed backends. One line per item, each ending in a newline.
    pub fn summary(&self, dir: &Path) -> String {
        use std::fmt::Write;
        let c = self.common();
        let target = match self {
            ArtifactManifest::Cpu(m) => format!("{} ({})", m.target.triple, m.target.cpu_features.join(",")),
            ArtifactManifest::Cuda(m) => {
                format!("{} ({}, PTX ISA {})", m.target.triple, m.target.arch.name(), m.target.ptx_isa)
            }
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "artifact {}: {} for {target}, written by kiln {}",
            dir.display(),
            self.kind(),
            c.kiln_version
        );
        for (what, ports) in [("inputs", &c.inputs), ("outputs", &c.outputs)] {
            let _ = writeln!(out, "{what}:");
            for p in ports {
                let _ = writeln!(out, "  {}: {}{}", p.name, p.dtype, p.shape);
            }
        }
        let n = c.executable.step_counts();
        let _ = writeln!(
            out,
            "steps: {} library, {} kernel, {} interpreter, {} copy, {} on other backends; arena {} KiB",
            n[0],
            n[1],
            n[2],
            n[3],
            n[4],
            c.executable.arena_bytes / 1024
        );
        for p in &c.placement {
            let _ = writeln!(
                out,
                "placed: backend `{}` (priority {}) runs {} node(s)",
                p.backend,
                p.priority,
                p.nodes.len()
            );
        }
        out
    }

    /// Reads file `digest.file` of the artifact in `dir` and checks its BLAKE3 digest: a tampered file, or one
    /// from another artifact, is refused. Returns the bytes.
    pub fn check_file(dir: &Path, digest: &FileDigest) -> Result<Vec<u8>, ArtifactError> {
        let path = artifact_file(dir, &digest.file)?;
        let bytes = kiln_ir::io::read_file(&path).map_err(|e| {
            let why = if e.kind() == std::io::ErrorKind::NotFound {
                "the file is missing (an incomplete artifact)".to_string()
            } else {
                format!("cannot read: {e}")
            };
            artifact_error(&path, why)
        })?;
        let got = crate::weights::digest(&bytes);
        if got != digest.blake3 {
            return Err(artifact_error(
                &path,
                "its digest does not match the manifest (the file was changed, or comes from another artifact): \
                 recompile the model with `kiln compile`",
            ));
        }
        Ok(bytes)
    }
}

/// Whether `path` looks like an artifact: a directory holding a manifest.
pub fn is_artifact(path: &Path) -> bool {
    path.is_dir() && path.join(MANIFEST_FILE).is_file()
}

/// Reads the manifest of the artifact in `dir`: its format version first, then the whole; then its program's
/// consistency ([`ArtifactManifest::check_program`]). Target checks (triple, CPU features, GPU) are the
/// loader's, which knows the machine.
pub fn read_manifest(dir: &Path) -> Result<ArtifactManifest, ArtifactError> {
    let path = dir.join(MANIFEST_FILE);
    let text = kiln_ir::io::read_text(&path).map_err(|e| artifact_error(&path, format!("cannot read: {e}")))?;
    parse_manifest(&path, &text)
}

/// Parses and checks manifest text (read from `path`, which names it in errors), as [`read_manifest`] does.
pub fn parse_manifest(path: &Path, text: &str) -> Result<ArtifactManifest, ArtifactError> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| artifact_error(path, format!("corrupt manifest (not valid JSON): {e}")))?;
    let version = value
        .get("format_version")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| artifact_error(path, "no `format_version`: not a kiln artifact manifest"))?;
    if version != u64::from(FORMAT_VERSION) {
        return Err(artifact_error(
            path,
            format!(
                "format version {version} is not supported: this kiln ({}) reads format version {FORMAT_VERSION}; \
                 recompile the model with `kiln compile`",
                env!("CARGO_PKG_VERSION")
            ),
        ));
    }
    let manifest: ArtifactManifest =
        serde_json::from_value(value).map_err(|e| artifact_error(path, format!("corrupt manifest: {e}")))?;
    manifest.check_program().map_err(|e| artifact_error(path, format!("corrupt manifest: {e}")))?;
    if manifest.common().digest != manifest.canonical_digest() {
        return Err(artifact_error(
            path,
            "the manifest's digest does not match its contents (it was changed after `kiln compile` wrote it): \
             recompile the model",
        ));
    }
    Ok(manifest)
}

/// Records the manifest's own digest ([`ArtifactManifest::canonical_digest`]) in it.
pub fn seal(manifest: &mut ArtifactManifest) {
    let digest = manifest.canonical_digest();
    manifest.common_mut().digest = digest;
}

/// Seals `manifest` ([`seal`]) and writes it into `dir` (last, so an interrupted write leaves no loadable
/// artifact).
pub fn write_manifest(dir: &Path, manifest: &mut ArtifactManifest) -> Result<(), ArtifactError> {
    seal(manifest);
    let path = dir.join(MANIFEST_FILE);
    let text = serde_json::to_string_pretty(manifest)
        .map_err(|e| artifact_error(&path, format!("cannot serialize the manifest: {e}")))?;
    std::fs::write(&path, text + "\n").map_err(|e| artifact_error(&path, format!("cannot write: {e}")))
}

/// The path of file `name` of the artifact in `dir`: the manifest names files inside the artifact only.
pub fn artifact_file(dir: &Path, name: &str) -> Result<PathBuf, ArtifactError> {
    let relative = Path::new(name);
    if !name.is_empty() && relative.components().all(|c| matches!(c, Component::Normal(_))) {
        Ok(dir.join(relative))
    } else {
        Err(artifact_error(&dir.join(MANIFEST_FILE), format!("`{name}` is not a file of the artifact")))
    }
}
