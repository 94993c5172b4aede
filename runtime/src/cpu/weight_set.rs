//! Atomic weight swaps for a [`CpuProgram`].
//!
//! Everything a run reads that derives from weights — the weights, the results of the prepare steps, the packed
//! matmul operands — is one immutable [`WeightSet`] behind an `Arc`. A run takes the current set once, at its
//! start, and keeps it to its end. A swap ([`CpuProgram::load_weights`], [`CpuProgram::bind_parameters`])
//! materializes and validates every destination, builds a complete new set (prepare steps re-run, operands
//! re-packed) and only then publishes it with one pointer store. Any error before that leaves the program
//! exactly as it was; a run never sees some new weights and some old ones.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use kiln_codegen::exec::{BufferId, Home};
use kiln_codegen::library::PackedB;
use kiln_ir::Tensor;

use crate::RunError;
use crate::checkpoint::CheckpointSource;
use crate::contract::ParameterBackend;
use crate::cpu::{CpuBackend, CpuParameter, CpuProgram, Packing};
use crate::recipe::DerivedWeightRecipe;

/// The weight-derived state one run reads. See the module docs.
#[derive(Default)]
pub(crate) struct WeightSet {
    /// Weights by name.
    pub(crate) weights: HashMap<String, Arc<Tensor>>,
    /// Results of the prepare steps, by `Home::Prepared` index.
    pub(crate) prepared: Vec<Arc<Tensor>>,
    /// Matmul right operands packed for `library::matmul_packed_f32`, by buffer.
    pub(crate) packed: HashMap<BufferId, Arc<PackedB>>,
}

/// What a weight load takes from where.
#[derive(Clone, Debug, Default)]
pub struct WeightLoad {
    /// Destinations computed by a recipe instead of read by name.
    pub recipes: BTreeMap<String, DerivedWeightRecipe>,
    /// Destinations the checkpoint may lack: they keep their current weight (weights the compiler made, say).
    pub optional: BTreeSet<String>,
}

/// What a successful weight load did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WeightLoadReport {
    /// Destinations given new weights, sorted.
    pub replaced: Vec<String>,
    /// Optional destinations the checkpoint lacked, which kept their weights, sorted.
    pub kept: Vec<String>,
    /// Checkpoint tensors no destination (nor recipe) read, sorted.
    pub unused: Vec<String>,
}

impl CpuProgram {
    /// One slot per weight the program reads, sorted by name, with its compiled type, whether the program packs
    /// it, and the weight bound now.
    pub fn parameters(&self) -> Vec<CpuParameter> {
        let set = self.weight_set();
        let packable = self.packable_operands();
        let mut slots: BTreeMap<&str, CpuParameter> = BTreeMap::new();
        for (i, info) in self.exe.buffers.iter().enumerate() {
            let Home::Weight(name) = &info.home else { continue };
            let packing = if packable.contains(&BufferId(i as u32)) { Packing::Gemm } else { Packing::None };
            let slot = slots.entry(name).or_insert_with(|| CpuParameter::new(name, info.ty.clone(), Packing::None));
            if packing == Packing::Gemm {
                *slot = CpuParameter::new(name, info.ty.clone(), Packing::Gemm);
            }
        }
        slots
            .into_values()
            .map(|mut slot| {
                if let Some(t) = set.weights.get(slot.name()) {
                    let current = crate::cpu::CpuWeight::new(Arc::clone(t));
                    // The program's own weights always fit their slots.
                    let _ = CpuBackend::bind(&mut slot, current);
                }
                slot
            })
            .collect()
    }

    /// The weight of this name that runs read now.
    pub fn weight(&self, name: &str) -> Option<Arc<Tensor>> {
        self.weight_set().weights.get(name).cloned()
    }

    /// Publishes bound parameters as the program's weights, atomically: every slot of [`CpuProgram::parameters`]
    /// must be present with a weight that passes `validate_bind`; the prepare steps and packing run on the new
    /// set; only then do new runs see it. On any error nothing changes.
    pub fn bind_parameters(&self, parameters: Vec<CpuParameter>) -> Result<(), RunError> {
        let _swap = self.swapping.lock().unwrap_or_else(|e| e.into_inner());
        let mut given: BTreeMap<String, CpuParameter> = BTreeMap::new();
        for p in parameters {
            if let Some(dup) = given.insert(p.name().to_string(), p) {
                return Err(RunError::Weights(format!("weight `{}` is bound twice", dup.name())));
            }
        }
        let mut errors = Vec::new();
        let mut bound = Vec::new();
        for mut slot in self.parameters() {
            match given.remove(slot.name()).and_then(|p| p.weight().cloned()) {
                None => errors.push(format!("weight `{}` is not bound", slot.name())),
                Some(w) => match CpuBackend::validate_bind(&slot, &w) {
                    Err(e) => errors.push(e.to_string()),
                    Ok(()) => {
                        CpuBackend::bind(&mut slot, w)?;
                        bound.push(slot);
                    }
                },
            }
        }
        errors.extend(given.keys().map(|n| format!("the program has no weight `{n}`")));
        if !errors.is_empty() {
            return Err(RunError::Weights(errors.join("; ")));
        }
        self.publish_parameters(bound)
    }

    /// Builds a set from validated, bound slots and publishes it.
    fn publish_parameters(&self, bound: Vec<CpuParameter>) -> Result<(), RunError> {
        let mut weights = HashMap::new();
        let mut prepacked = HashMap::new();
        for p in bound {
            let Some(w) = p.weight() else { continue };
            weights.insert(p.name().to_string(), Arc::clone(w.tensor()));
            if let Some(packed) = w.packed() {
                prepacked.insert(p.name().to_string(), Arc::clone(packed));
            }
        }
        let set = self.build_weight_set(weights, &prepacked)?;
        self.publish(set);
        Ok(())
    }

    /// Replaces the program's weights with `source`'s, atomically (see the module docs). Each destination is read
    /// by its name (or computed by its recipe in `load.recipes`), converted exactly to its compiled dtype, packed
    /// when the program packs it, and validated; a destination the checkpoint lacks is an error unless it is in
    /// `load.optional`. Every problem is reported at once, naming the tensors; on any error nothing changes.
    pub fn load_weights(&self, source: &dyn CheckpointSource, load: &WeightLoad) -> Result<WeightLoadReport, RunError> {
        let _swap = self.swapping.lock().unwrap_or_else(|e| e.into_inner());
        let mut report = WeightLoadReport::default();
        let mut errors = Vec::new();
        let mut bound = Vec::new();
        let mut read: BTreeSet<String> = BTreeSet::new();
        for mut slot in self.parameters() {
            let options = slot.materialize_options();
            let name = slot.name().to_string();
            let materialized = if let Some(recipe) = load.recipes.get(&name) {
                read.extend(recipe.leaves().into_iter().map(String::from));
                CpuBackend::materialize_recipe(recipe, source, &options)
            } else if source.contains(&name) {
                read.insert(name.clone());
                source.lease(&name).and_then(|lease| CpuBackend::materialize(lease, &options))
            } else if load.optional.contains(&name) {
                report.kept.push(name);
                bound.push(slot);
                continue;
            } else {
                errors.push(format!("tensor `{name}` is missing (the program needs {})", slot.ty()));
                continue;
            };
            let weight = match materialized.and_then(CpuBackend::finish_materialization) {
                Ok(w) => w,
                Err(e) => {
                    errors.push(strip_origin(e, source.origin()));
                    continue;
                }
            };
            if let Err(e) = CpuBackend::validate_bind(&slot, &weight) {
                errors.push(strip_origin(e, source.origin()));
                continue;
            }
            CpuBackend::bind(&mut slot, weight)?;
            report.replaced.push(name);
            bound.push(slot);
        }
        if !errors.is_empty() {
            return Err(RunError::Checkpoint {
                path: source.origin().to_string(),
                message: format!("{}; no weight was changed", errors.join("; ")),
            });
        }
        report.unused = source.names().into_iter().filter(|n| !read.contains(n)).collect();
        self.publish_parameters(bound).map_err(|e| RunError::Checkpoint {
            path: source.origin().to_string(),
            message: format!("{}; no weight was changed", strip_origin(e, source.origin())),
        })?;
        Ok(report)
    }
}

/// An error's message without the checkpoint path in front (the combined error names it once).
fn strip_origin(e: RunError, origin: &str) -> String {
    match e {
        RunError::Checkpoint { path, message } if path == origin => message,
        e => e.to_string(),
    }
}
