//! Swapping a compiled model's weights from a checkpoint, atomically.
//!
//! A compiled program reads the weights of the *optimized* graph. Most are the model's own parameters, but the
//! pass pipeline may also make weights (`fold-constants` turns large folded constants into `const.N` weights,
//! `fold-batchnorm` writes `<w>.bn_folded` weights computed from the model's) and may stop reading a model
//! weight as such (folded into another one, or dead). [`WeightProvenance`] records both at compile time, so
//! [`Compiled::load_weights`] can hold a model checkpoint to the model's parameters:
//! - every model parameter must be in the checkpoint (a missing one is an error);
//! - a parameter the program reads is replaced (converted exactly to the compiled dtype, validated);
//! - a parameter the compiler folded away must keep the value it was compiled with — the program cannot apply a
//!   new one without recompiling, so a changed value is an error, never a silently stale answer;
//! - weights the compiler made keep their values unless the checkpoint names them.
//!
//! All checks and all conversions happen before anything is published: on any error the model keeps serving
//! its old weights.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use kiln_ir::{DType, Graph, Op};
use kiln_runtime::checkpoint::{Checkpoint, CheckpointSource, MemoryCheckpoint};
use kiln_runtime::contract::ParameterBackend;
use kiln_runtime::cpu::{CpuBackend, DTypeRule, MaterializeOptions, Packing, WeightLoad, WeightLoadReport};

use crate::{Compiled, Error};

/// A compile-time weight value, remembered without its bytes: dtype, shape and a 64-bit FNV-1a hash of the
/// little-endian bytes (stable across processes, so artifacts can carry it).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WeightFingerprint {
    /// The element type.
    pub dtype: DType,
    /// The extents.
    pub shape: Vec<usize>,
    /// FNV-1a of the bytes.
    pub hash: u64,
}

impl WeightFingerprint {
    /// The fingerprint of a tensor's dtype, shape and bytes.
    pub fn of(dtype: DType, shape: &[usize], bytes: &[u8]) -> WeightFingerprint {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in bytes {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        WeightFingerprint { dtype, shape: shape.to_vec(), hash }
    }
}

/// Where a compiled program's weights come from. See the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WeightProvenance {
    /// Weights of the compiled program that the pass pipeline made (not model parameters).
    pub compiler_made: BTreeSet<String>,
    /// Model parameters the compiled program does not read as such, with their compile-time values.
    pub folded: BTreeMap<String, WeightFingerprint>,
}

impl WeightProvenance {
    /// Compares the model graph (before passes) with the weight names the compiled program reads.
    pub fn new(model: &Graph, program_weights: &BTreeSet<String>) -> WeightProvenance {
        let params: BTreeSet<String> = model
            .params()
            .filter_map(|id| match &model.node(id).op {
                Op::Parameter(p) => Some(p.name.clone()),
                _ => None,
            })
            .collect();
        let compiler_made = program_weights.difference(&params).cloned().collect();
        let folded = params
            .difference(program_weights)
            .filter_map(|name| {
                let t = model.weights.get(name)?;
                Some((name.clone(), WeightFingerprint::of(t.dtype(), t.shape(), t.as_bytes())))
            })
            .collect();
        WeightProvenance { compiler_made, folded }
    }
}

impl Compiled {
    /// The weight of this name that runs read now (after any swap), if the program reads one.
    pub fn weight(&self, name: &str) -> Option<std::sync::Arc<kiln_ir::Tensor>> {
        self.program.weight(name)
    }

    /// Replaces the model's weights with those of the safetensors checkpoint at `path` (memory-mapped), by name,
    /// atomically: see the module docs for the rules. Runs in flight finish with the old weights; runs started
    /// after this returns `Ok` use the new ones. On `Err` nothing changed.
    pub fn load_weights(&self, path: &Path) -> Result<WeightLoadReport, Error> {
        let checkpoint = Checkpoint::open(path).map_err(|e| weights_error(path, e))?;
        self.load_weights_from(&checkpoint)
    }

    /// [`Compiled::load_weights`] from weights in memory (each tensor is copied once, into its new weight).
    pub fn swap_weights(&self, weights: &kiln_ir::Weights) -> Result<WeightLoadReport, Error> {
        let mut checkpoint = MemoryCheckpoint::new("(weights in memory)");
        for (name, t) in weights.iter() {
            checkpoint.insert(name, t);
        }
        self.load_weights_from(&checkpoint)
    }

    /// [`Compiled::load_weights`] from any checkpoint source.
    pub fn load_weights_from(&self, source: &dyn CheckpointSource) -> Result<WeightLoadReport, Error> {
        let origin = Path::new(source.origin());
        let mut load = WeightLoad::default();
        let mut errors = Vec::new();
        if let Some(provenance) = &self.provenance {
            load.optional = provenance.compiler_made.clone();
            for (name, compiled) in &provenance.folded {
                if !source.contains(name) {
                    errors.push(format!("tensor `{name}` is missing (the model has this parameter)"));
                    continue;
                }
                let lease = match source.lease(name) {
                    Ok(l) => l,
                    Err(e) => {
                        errors.push(e.to_string());
                        continue;
                    }
                };
                // Compared in the compiled dtype, so an f16 checkpoint of the same values passes as it would for
                // a weight the program reads.
                let options = MaterializeOptions { dtype: DTypeRule::Exactly(compiled.dtype), packing: Packing::None };
                let same = CpuBackend::materialize(lease, &options)
                    .and_then(CpuBackend::finish_materialization)
                    .is_ok_and(|w| WeightFingerprint::of(w.dtype(), w.shape(), w.tensor().as_bytes()) == *compiled);
                if !same {
                    errors.push(format!(
                        "tensor `{name}` differs from the value the model was compiled with, but the compiled \
                         program does not read it (a pass folded it into other weights or removed it as unused): \
                         recompile with these weights instead"
                    ));
                }
            }
        }
        if !errors.is_empty() {
            return Err(Error::Weights {
                path: origin.display().to_string(),
                message: format!("{}; no weight was changed", errors.join("; ")),
            });
        }
        self.program.load_weights(source, &load).map_err(|e| weights_error(origin, e))
    }
}

/// A runtime checkpoint error as the facade's weights error.
fn weights_error(path: &Path, e: kiln_runtime::RunError) -> Error {
    match e {
        kiln_runtime::RunError::Checkpoint { path, message } => Error::Weights { path, message },
        e => Error::Weights { path: path.display().to_string(), message: e.to_string() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_tell_values_apart() {
        let a = WeightFingerprint::of(DType::F32, &[2], &[0, 0, 0, 0, 0, 0, 128, 63]);
        assert_eq!(a, WeightFingerprint::of(DType::F32, &[2], &[0, 0, 0, 0, 0, 0, 128, 63]));
        assert_ne!(a, WeightFingerprint::of(DType::F32, &[2], &[0, 0, 0, 0, 0, 0, 128, 64]));
        assert_ne!(a, WeightFingerprint::of(DType::F32, &[1, 2], &[0, 0, 0, 0, 0, 0, 128, 63]));
        assert_ne!(a, WeightFingerprint::of(DType::I32, &[2], &[0, 0, 0, 0, 0, 0, 128, 63]));
    }
}
