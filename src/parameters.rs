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

use std::path::Path;

use kiln_runtime::checkpoint::{Checkpoint, CheckpointSource, MemoryCheckpoint};
use kiln_runtime::cpu::{WeightLoad, WeightLoadReport};

use crate::{Compiled, Error};

pub use kiln_plan::weights::WeightProvenance;

impl Compiled {
    /// The weight of this name that runs read now (after any swap), if the program reads one.
    pub fn weight(&self, name: &str) -> Option<std::sync::Arc<kiln_ir::Tensor>> {
        self.cpu_program().ok()?.weight(name)
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
        let load = match &self.provenance {
            Some(p) => WeightLoad { optional: p.compiler_made.clone(), frozen: p.folded.clone(), ..Default::default() },
            None => WeightLoad::default(),
        };
        self.cpu_program()?.load_weights(source, &load).map_err(|e| weights_error(Path::new(source.origin()), e))
    }
}

/// A runtime checkpoint error as the facade's weights error.
fn weights_error(path: &Path, e: kiln_runtime::RunError) -> Error {
    match e {
        kiln_runtime::RunError::Checkpoint { path, message } => Error::Weights { path, message },
        e => Error::Weights { path: path.display().to_string(), message: e.to_string() },
    }
}
