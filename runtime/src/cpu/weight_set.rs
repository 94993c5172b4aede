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

use crate::library::PackedB;
use kiln_ir::Tensor;
use kiln_plan::exec::{BufferId, Home};

use crate::RunError;
use crate::checkpoint::CheckpointSource;
use crate::contract::ParameterBackend;
use crate::cpu::{CpuBackend, CpuParameter, CpuProgram, DTypeRule, MaterializeOptions, Packing};
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
    /// Prepared buffers dropped once packed (`CpuProgram::release_packed_prepared`): only their packed form
    /// exists.
    pub(crate) released: BTreeSet<BufferId>,
    /// 3×3 conv weights in the Winograd domain for `library::conv_winograd_f32`, by buffer.
    pub(crate) winograd: HashMap<BufferId, Arc<crate::library::WinogradWeights>>,
    /// 2-D right operands of integer matmuls less their zero points, packed for
    /// `library::matmul_integer_packed`, by (operand, zero point) buffers.
    pub(crate) packed_int8: HashMap<(BufferId, BufferId), Arc<crate::library::PackedInt8>>,
    /// LSTM and GRU weights packed for their calls, by (input weight, recurrent weight) buffers.
    pub(crate) recurrent: HashMap<(BufferId, BufferId), Arc<crate::library::RnnPacked>>,
    /// Integer conv weights packed for `library::conv_integer_packed` (AVX-512 VNNI), by (weights, zero point)
    /// buffers.
    pub(crate) packed_conv_int8: HashMap<(BufferId, BufferId), Arc<crate::library::PackedConvInt8>>,
}

pub use kiln_plan::weights::WeightFingerprint;

/// What a weight load takes from where.
#[derive(Clone, Debug, Default)]
pub struct WeightLoad {
    /// Destinations computed by a recipe instead of read by name.
    pub recipes: BTreeMap<String, DerivedWeightRecipe>,
    /// Destinations the checkpoint may lack: they keep their current weight (weights the compiler made, say).
    pub optional: BTreeSet<String>,
    /// Checkpoint tensors the program does not read (folded into other weights at compile time) that must be
    /// present and equal these values, compared after exact conversion to the fingerprint's dtype: the program
    /// cannot apply a new value, so a changed one is an error rather than a stale answer.
    pub frozen: BTreeMap<String, WeightFingerprint>,
}

/// What a successful weight load did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WeightLoadReport {
    /// Destinations given new weights, sorted.
    pub replaced: Vec<String>,
    /// Optional destinations the checkpoint lacked, which kept their weights, sorted.
    pub kept: Vec<String>,
    /// Frozen tensors found equal to their compiled values, sorted.
    pub unchanged: Vec<String>,
    /// Checkpoint tensors no destination (nor recipe) read, sorted.
    pub unused: Vec<String>,
}

impl CpuProgram {
    /// One slot per weight the program reads, sorted by name, with its compiled type, whether the program packs
    /// it, and the weight bound now.
    pub fn parameters(&self) -> Vec<CpuParameter> {
        let set = self.weight_set();
        let packable = self.packable_operands();
        let mut slots: BTreeMap<&str, (&kiln_ir::TensorType, Packing)> = BTreeMap::new();
        for (i, info) in self.exe.buffers.iter().enumerate() {
            let Home::Weight(name) = &info.home else { continue };
            let slot = slots.entry(name).or_insert((&info.ty, Packing::None));
            // A weight read by several steps is packed if any of them packs it.
            if packable.contains(&BufferId(i as u32)) {
                slot.1 = Packing::Gemm;
            }
        }
        slots
            .into_iter()
            .map(|(name, (ty, packing))| {
                let slot = CpuParameter::new(name, ty.clone(), packing);
                match set.weights.get(name) {
                    Some(t) => slot.with_weight(crate::cpu::CpuWeight::new(Arc::clone(t))),
                    None => slot,
                }
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
        for (name, expected) in &load.frozen {
            if !source.contains(name) {
                errors.push(format!("tensor `{name}` is missing (the model has this parameter)"));
                continue;
            }
            read.insert(name.clone());
            let options = MaterializeOptions { dtype: DTypeRule::Exactly(expected.dtype), packing: Packing::None };
            let same = source
                .lease(name)
                .and_then(|lease| CpuBackend::materialize(lease, &options))
                .and_then(CpuBackend::finish_materialization)
                .map(|w| WeightFingerprint::of_tensor(w.tensor()) == *expected);
            match same {
                Ok(true) => report.unchanged.push(name.clone()),
                Ok(false) => errors.push(format!(
                    "tensor `{name}` differs from the value the model was compiled with, but the compiled program \
                     does not read it (a pass folded it into other weights or removed it as unused): recompile \
                     with these weights instead"
                )),
                Err(e) => errors.push(strip_origin(e, source.origin())),
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::MemoryCheckpoint;
    use crate::cpu::KernelCode;
    use kiln_ir::DType;

    /// `y = x · transpose(wt) + b`: one weight through a prepare step (the transpose), one read directly.
    const LINEAR: &str = r#"graph "linear" {
  %0 = input {name="x"} : f32[2,3]
  %1 = param {name="wt"} : f32[4,3]
  %2 = param {name="b"} : f32[2,4]
  %3 = transpose %1 {perm=[1, 0]} : f32[3,4]
  %4 = matmul %0, %3 : f32[2,4]
  %5 = add %4, %2 : f32[2,4]
  output "y" = %5
}
"#;

    fn program(wt: &Tensor, b: &Tensor) -> CpuProgram {
        let mut g = kiln_ir::parse(LINEAR).unwrap();
        g.weights.insert("wt", wt.clone());
        g.weights.insert("b", b.clone());
        let exe = kiln_codegen::exec::build(&g).unwrap();
        let kernels = exe.kernels.clone();
        CpuProgram::new(exe, KernelCode::Reference(kernels), 1).unwrap()
    }

    fn run(p: &CpuProgram) -> Tensor {
        let x = Tensor::from_vec(vec![2, 3], vec![1.0f32, 2.0, 3.0, -1.0, 0.5, 0.0]).unwrap();
        p.run(&BTreeMap::from([("x".to_string(), x)])).unwrap().remove(0).1
    }

    fn weights(seed: u64) -> (Tensor, Tensor) {
        (Tensor::random(DType::F32, vec![4, 3], seed), Tensor::random(DType::F32, vec![2, 4], seed + 1))
    }

    #[test]
    fn fingerprints_tell_values_apart() {
        let a = WeightFingerprint::of(DType::F32, &[2], &[0, 0, 0, 0, 0, 0, 128, 63]);
        assert_eq!(a, WeightFingerprint::of(DType::F32, &[2], &[0, 0, 0, 0, 0, 0, 128, 63]));
        assert_ne!(a, WeightFingerprint::of(DType::F32, &[2], &[0, 0, 0, 0, 0, 0, 128, 64]));
        assert_ne!(a, WeightFingerprint::of(DType::F32, &[1, 2], &[0, 0, 0, 0, 0, 0, 128, 63]));
        assert_ne!(a, WeightFingerprint::of(DType::I32, &[2], &[0, 0, 0, 0, 0, 0, 128, 63]));
    }

    #[test]
    fn frozen_tensors_must_keep_their_values() {
        let (wt, b) = weights(1);
        let p = program(&wt, &b);
        let folded = Tensor::from_vec(vec![2], vec![0.5f32, -1.5]).unwrap();
        let load = WeightLoad {
            frozen: BTreeMap::from([("folded".to_string(), WeightFingerprint::of_tensor(&folded))]),
            ..Default::default()
        };
        // The same values in f16 pass (compared after exact widening); different values, or none, do not.
        let halves = Tensor::from_vec(vec![2], vec![half::f16::from_f32(0.5), half::f16::from_f32(-1.5)]).unwrap();
        let ck = MemoryCheckpoint::new("mem").with("wt", &wt).with("b", &b).with("folded", &halves);
        assert_eq!(p.load_weights(&ck, &load).unwrap().unchanged, ["folded"]);
        let changed = Tensor::from_vec(vec![2], vec![0.5f32, 1.5]).unwrap();
        let ck = MemoryCheckpoint::new("mem").with("wt", &wt).with("folded", &changed);
        let err = p.load_weights(&ck, &load).unwrap_err().to_string();
        // Every problem at once: the missing destination and the changed frozen tensor.
        assert!(err.contains("tensor `b` is missing") && err.contains("tensor `folded` differs"), "{err}");
        let ck = MemoryCheckpoint::new("mem").with("wt", &wt).with("b", &b);
        let err = p.load_weights(&ck, &load).unwrap_err().to_string();
        assert!(err.contains("tensor `folded` is missing"), "{err}");
    }

    #[test]
    fn load_weights_reruns_prepare_steps_and_matches_a_fresh_program() {
        let ((wt_a, b_a), (wt_b, b_b)) = (weights(1), weights(10));
        let p = program(&wt_a, &b_a);
        assert_eq!(p.executable().prepare.len(), 1, "the transpose of `wt` is a prepare step");
        let names: Vec<String> = p.parameters().iter().map(|s| s.name().to_string()).collect();
        assert_eq!(names, ["b", "wt"]);
        let ck = MemoryCheckpoint::new("mem").with("wt", &wt_b).with("b", &b_b).with("extra", &b_b);
        let report = p.load_weights(&ck, &WeightLoad::default()).unwrap();
        assert_eq!(report.replaced, ["b", "wt"]);
        assert_eq!(report.unused, ["extra"]);
        assert_eq!(run(&p), run(&program(&wt_b, &b_b)));
    }

    #[test]
    fn recipes_and_optional_destinations() {
        let ((wt_a, b_a), (wt_b, _)) = (weights(1), weights(10));
        let p = program(&wt_a, &b_a);
        // `wt` comes transposed in this checkpoint, as `w`; `b` is absent but optional.
        let w = DerivedWeightRecipe::Transpose { source: Box::new(DerivedWeightRecipe::tensor("w")), perm: vec![1, 0] };
        let w_stored =
            DerivedWeightRecipe::Transpose { source: Box::new(DerivedWeightRecipe::tensor("wt")), perm: vec![1, 0] }
                .evaluate(&MemoryCheckpoint::new("mem").with("wt", &wt_b))
                .unwrap();
        let ck = MemoryCheckpoint::new("mem").with("w", &w_stored);
        let load = WeightLoad {
            recipes: BTreeMap::from([("wt".to_string(), w)]),
            optional: BTreeSet::from(["b".to_string()]),
            ..Default::default()
        };
        let report = p.load_weights(&ck, &load).unwrap();
        assert_eq!((report.replaced, report.kept), (vec!["wt".to_string()], vec!["b".to_string()]));
        assert_eq!(run(&p), run(&program(&wt_b, &b_a)));
        // Without `optional`, the missing `b` is an error and nothing changes.
        let before = run(&p);
        let err = p.load_weights(&ck, &WeightLoad { optional: BTreeSet::new(), ..load }).unwrap_err().to_string();
        assert!(err.contains("tensor `b` is missing (the program needs f32[2,4])"), "{err}");
        assert_eq!(run(&p), before);
    }

    #[test]
    fn bind_parameters_publishes_only_a_complete_valid_set() {
        let ((wt_a, b_a), (wt_b, b_b)) = (weights(1), weights(10));
        let p = program(&wt_a, &b_a);
        let before = run(&p);
        let ck = MemoryCheckpoint::new("mem").with("wt", &wt_b).with("b", &b_b);
        let bound = |names: &[(&str, &str)]| -> Vec<CpuParameter> {
            let slots = p.parameters();
            names
                .iter()
                .map(|(slot, tensor)| {
                    let mut s = slots.iter().find(|s| s.name() == *slot).cloned().unwrap_or_else(|| {
                        CpuParameter::new(
                            *slot,
                            kiln_ir::TensorType::new(DType::F32, kiln_ir::Shape(vec![])),
                            Packing::None,
                        )
                    });
                    let m = CpuBackend::materialize(ck.lease(tensor).unwrap(), &Default::default()).unwrap();
                    // Bound without validation here: `bind_parameters` must validate itself.
                    CpuBackend::bind(&mut s, CpuBackend::finish_materialization(m).unwrap()).unwrap();
                    s
                })
                .collect()
        };
        let err = p.bind_parameters(bound(&[("wt", "wt")])).unwrap_err().to_string();
        assert!(err.contains("weight `b` is not bound"), "{err}");
        let err = p.bind_parameters(bound(&[("wt", "wt"), ("b", "wt")])).unwrap_err().to_string();
        assert!(err.contains("weight `b` should be f32[2,4], got f32[4,3]"), "{err}");
        let err = p.bind_parameters(bound(&[("wt", "wt"), ("b", "b"), ("other", "b")])).unwrap_err().to_string();
        assert!(err.contains("the program has no weight `other`"), "{err}");
        assert_eq!(run(&p), before, "failed binds changed nothing");
        p.bind_parameters(bound(&[("wt", "wt"), ("b", "b")])).unwrap();
        assert_eq!(run(&p), run(&program(&wt_b, &b_b)));
    }
}
