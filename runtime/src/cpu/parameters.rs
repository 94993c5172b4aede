//! [`ParameterBackend`] on the CPU: weights are host tensors behind `Arc`s, optionally with a pre-packed GEMM
//! operand; materializing is synchronous (the copy out of the mapped checkpoint happens in `materialize`), so a
//! materialization is complete when it is returned and finishing it only releases the checkpoint lease.
//!
//! Dtype conversion is exact or refused: a [`DTypeRule::Exactly`] destination accepts its own dtype and the
//! widenings that lose nothing (f16/bf16 → f32/f64, f32 → f64, narrower integers → wider ones); anything else
//! (f32 → f16, f32 → i32) is an error naming the tensor and both dtypes, never a silent rounding.

use std::sync::Arc;

use crate::library::PackedB;
use kiln_ir::{DType, Dim, Tensor, TensorType};

use crate::RunError;
use crate::checkpoint::{CheckpointLease, CheckpointSource};
use crate::contract::ParameterBackend;
use crate::cpu::CpuBackend;
use crate::recipe::DerivedWeightRecipe;

/// A weight on the CPU: its tensor and, when asked for, the same matrix packed for
/// [`crate::library::matmul_packed_f32`]. Cloning shares both (no bytes are copied).
#[derive(Clone)]
pub struct CpuWeight {
    tensor: Arc<Tensor>,
    packed: Option<Arc<PackedB>>,
}

impl CpuWeight {
    /// A weight over `tensor`, unpacked.
    pub fn new(tensor: Arc<Tensor>) -> CpuWeight {
        CpuWeight { tensor, packed: None }
    }

    /// The tensor.
    pub fn tensor(&self) -> &Arc<Tensor> {
        &self.tensor
    }

    /// The packed GEMM operand, when the weight was materialized with [`Packing::Gemm`].
    pub fn packed(&self) -> Option<&Arc<PackedB>> {
        self.packed.as_ref()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.tensor.dtype()
    }

    /// The extents.
    pub fn shape(&self) -> &[usize] {
        self.tensor.shape()
    }

    /// Packs the weight for GEMM (a no-op when already packed); only 2-D f32 weights can be.
    pub fn pack(mut self, name: &str) -> Result<CpuWeight, RunError> {
        if self.packed.is_some() {
            return Ok(self);
        }
        let (Some(data), [k, n]) = (self.tensor.as_slice::<f32>(), self.tensor.shape()) else {
            return Err(RunError::Weights(format!(
                "weight `{name}` ({}) cannot be packed as a GEMM operand: only 2-D f32 matrices can",
                self.tensor.tensor_type()
            )));
        };
        let packed = PackedB::pack(data, *k, *n).map_err(|e| RunError::Weights(format!("weight `{name}`: {e}")))?;
        self.packed = Some(Arc::new(packed));
        Ok(self)
    }
}

impl std::fmt::Debug for CpuWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuWeight({}{})", self.tensor.tensor_type(), if self.packed.is_some() { ", packed" } else { "" })
    }
}

/// Which dtype a materialized weight gets.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum DTypeRule {
    /// The checkpoint's own dtype.
    #[default]
    Keep,
    /// f16 and bf16 widened to f32 (exactly); other dtypes kept.
    WidenHalfToF32,
    /// Exactly this dtype: the checkpoint's if equal, else an exact widening (see the module docs), else an error.
    Exactly(DType),
}

/// Whether a weight is also packed for GEMM.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Packing {
    /// Stored as a plain tensor.
    #[default]
    None,
    /// Also packed for `matmul_packed_f32` (2-D f32 weights only; others are an error).
    Gemm,
}

/// The CPU's materialization context.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MaterializeOptions {
    /// The dtype the weight gets.
    pub dtype: DTypeRule,
    /// Whether it is packed for GEMM.
    pub packing: Packing,
}

/// A CPU materialization: already complete; holds its checkpoint lease until finished.
pub struct CpuMaterialization {
    weight: CpuWeight,
    lease: Option<CheckpointLease>,
}

impl CpuMaterialization {
    /// The checkpoint lease it still retains (`None` for recipes, whose sources are released as they are read).
    pub fn lease(&self) -> Option<&CheckpointLease> {
        self.lease.as_ref()
    }
}

/// One parameter slot of a CPU program: the weight name, the type the program was compiled for, whether the
/// program wants it packed, and the weight bound to it.
#[derive(Clone, Debug)]
pub struct CpuParameter {
    name: String,
    ty: TensorType,
    packing: Packing,
    weight: Option<CpuWeight>,
}

impl CpuParameter {
    /// An empty slot.
    pub fn new(name: impl Into<String>, ty: TensorType, packing: Packing) -> CpuParameter {
        CpuParameter { name: name.into(), ty, packing, weight: None }
    }

    /// The weight's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The type the program expects.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// Whether the program packs this weight for GEMM.
    pub fn packing(&self) -> Packing {
        self.packing
    }

    /// The slot with `weight` bound, unvalidated (for the program's own current weights).
    pub(crate) fn with_weight(mut self, weight: CpuWeight) -> CpuParameter {
        self.weight = Some(weight);
        self
    }

    /// The bound weight, if any.
    pub fn weight(&self) -> Option<&CpuWeight> {
        self.weight.as_ref()
    }

    /// The context that materializes a weight for this slot: its dtype exactly, packed as the program wants.
    pub fn materialize_options(&self) -> MaterializeOptions {
        MaterializeOptions { dtype: DTypeRule::Exactly(self.ty.dtype), packing: self.packing }
    }
}

/// Whether `from` converts to `to` without losing anything.
fn exact_widening(from: DType, to: DType) -> bool {
    use DType::*;
    matches!(
        (from, to),
        (F16 | BF16, F32 | F64) | (F32, F64) | (I8 | U8 | Bool, I32 | I64) | (I32, I64) | (Bool, I8 | U8)
    )
}

/// `tensor` (named `name`, from `origin`) in the dtype and packing `options` ask for.
fn finish_tensor(
    origin: &str,
    name: &str,
    tensor: Tensor,
    options: &MaterializeOptions,
) -> Result<CpuWeight, RunError> {
    let target = match options.dtype {
        DTypeRule::Keep => tensor.dtype(),
        DTypeRule::WidenHalfToF32 if matches!(tensor.dtype(), DType::F16 | DType::BF16) => DType::F32,
        DTypeRule::WidenHalfToF32 => tensor.dtype(),
        DTypeRule::Exactly(d) => d,
    };
    let tensor = if target == tensor.dtype() {
        tensor
    } else if exact_widening(tensor.dtype(), target) {
        crate::recipe::cast(&tensor, target)
            .map_err(|m| RunError::Checkpoint { path: origin.to_string(), message: format!("tensor `{name}`: {m}") })?
    } else {
        return Err(RunError::Checkpoint {
            path: origin.to_string(),
            message: format!(
                "tensor `{name}` is {} but {target} is needed, and {} does not convert to {target} exactly",
                tensor.dtype(),
                tensor.dtype()
            ),
        });
    };
    let weight = CpuWeight::new(Arc::new(tensor));
    match options.packing {
        Packing::None => Ok(weight),
        Packing::Gemm => weight.pack(name),
    }
}

impl ParameterBackend for CpuBackend {
    type Parameter = CpuParameter;
    type MaterializedWeight = CpuWeight;
    type MaterializationContext = MaterializeOptions;
    type Materialization = CpuMaterialization;
    type ParameterError = RunError;

    fn materialize(lease: CheckpointLease, context: &MaterializeOptions) -> Result<CpuMaterialization, RunError> {
        let weight = finish_tensor(lease.origin(), lease.name(), lease.to_tensor()?, context)?;
        Ok(CpuMaterialization { weight, lease: Some(lease) })
    }

    fn materialize_recipe(
        recipe: &DerivedWeightRecipe,
        source: &dyn CheckpointSource,
        context: &MaterializeOptions,
    ) -> Result<CpuMaterialization, RunError> {
        let tensor = recipe.evaluate(source)?;
        let name = format!("{} of {}", recipe.op_name(), recipe.leaves().join(", "));
        let weight = finish_tensor(source.origin(), &name, tensor, context)?;
        Ok(CpuMaterialization { weight, lease: None })
    }

    fn materialized_weight(materialization: &CpuMaterialization) -> &CpuWeight {
        &materialization.weight
    }

    fn finish_materialization(materialization: CpuMaterialization) -> Result<CpuWeight, RunError> {
        // The copy finished inside `materialize`; dropping the lease here releases the mapping's share.
        let CpuMaterialization { weight, lease } = materialization;
        drop(lease);
        Ok(weight)
    }

    fn share_materialized_weight(weight: &CpuWeight) -> Result<CpuWeight, RunError> {
        Ok(weight.clone())
    }

    fn validate_bind(parameter: &CpuParameter, weight: &CpuWeight) -> Result<(), RunError> {
        let ty = &parameter.ty;
        let fits_shape = ty.shape.0.len() == weight.shape().len()
            && ty.shape.0.iter().zip(weight.shape()).all(|(d, &n)| match d {
                Dim::Static(s) => *s == n as u64,
                Dim::Sym(_) => false,
            });
        if weight.dtype() != ty.dtype || !fits_shape {
            return Err(RunError::Weights(format!(
                "weight `{}` should be {ty}, got {}",
                parameter.name,
                weight.tensor.tensor_type()
            )));
        }
        if let Some(p) = &weight.packed
            && weight.shape() != [p.k(), p.n()]
        {
            return Err(RunError::Weights(format!(
                "weight `{}`: its packed operand is {}×{}, not {:?}",
                parameter.name,
                p.k(),
                p.n(),
                weight.shape()
            )));
        }
        Ok(())
    }

    fn bind(parameter: &mut CpuParameter, weight: CpuWeight) -> Result<(), RunError> {
        // Nothing here can fail: `validate_bind` checked everything this slot cares about.
        parameter.weight = Some(weight);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{Checkpoint, MemoryCheckpoint};

    fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_vec(shape.to_vec(), v.to_vec()).unwrap()
    }

    fn slot(name: &str, ty: &str, packing: Packing) -> CpuParameter {
        let (dtype, dims) = ty.split_once(':').unwrap();
        let dims: Vec<u64> = dims.split('x').map(|d| d.parse().unwrap()).collect();
        let dtype = DType::ALL.into_iter().find(|d| d.name() == dtype).unwrap();
        CpuParameter::new(
            name,
            TensorType::new(dtype, kiln_ir::Shape(dims.into_iter().map(Into::into).collect())),
            packing,
        )
    }

    #[test]
    fn materialize_widens_half_and_packs() {
        let h: Vec<half::f16> = [1.0f32, -0.5, 65504.0, 0.0].iter().map(|&x| half::f16::from_f32(x)).collect();
        let ck = MemoryCheckpoint::new("mem").with("h", &Tensor::from_vec(vec![2, 2], h).unwrap());
        let widen = MaterializeOptions { dtype: DTypeRule::WidenHalfToF32, packing: Packing::Gemm };
        let m = CpuBackend::materialize(ck.lease("h").unwrap(), &widen).unwrap();
        assert!(m.lease().is_some(), "the lease is held until finished");
        let w = CpuBackend::finish_materialization(m).unwrap();
        assert_eq!(w.tensor().as_ref(), &f32s(&[2, 2], &[1.0, -0.5, 65504.0, 0.0]));
        let p = w.packed().expect("packed");
        assert_eq!((p.k(), p.n()), (2, 2));
        // Keep leaves the f16 as it is.
        let kept = CpuBackend::materialize(ck.lease("h").unwrap(), &MaterializeOptions::default()).unwrap();
        assert_eq!(CpuBackend::materialized_weight(&kept).dtype(), DType::F16);
        // bf16 widens too.
        let b: Vec<half::bf16> = [3.0f32, -1.25].iter().map(|&x| half::bf16::from_f32(x)).collect();
        let ck = ck.with("b", &Tensor::from_vec(vec![2], b).unwrap());
        let exact = MaterializeOptions { dtype: DTypeRule::Exactly(DType::F32), packing: Packing::None };
        let w = CpuBackend::finish_materialization(CpuBackend::materialize(ck.lease("b").unwrap(), &exact).unwrap());
        assert_eq!(w.unwrap().tensor().as_ref(), &f32s(&[2], &[3.0, -1.25]));
    }

    #[test]
    fn inexact_conversions_and_bad_packing_are_errors() {
        let ck = MemoryCheckpoint::new("mem")
            .with("w", &f32s(&[2], &[1.0, 2.0]))
            .with("i", &Tensor::from_vec(vec![2], vec![1i64, 2]).unwrap());
        let to_f16 = MaterializeOptions { dtype: DTypeRule::Exactly(DType::F16), packing: Packing::None };
        let err = CpuBackend::materialize(ck.lease("w").unwrap(), &to_f16).err().unwrap().to_string();
        assert!(err.contains("tensor `w` is f32 but f16 is needed"), "{err}");
        let to_i32 = MaterializeOptions { dtype: DTypeRule::Exactly(DType::I32), packing: Packing::None };
        let err = CpuBackend::materialize(ck.lease("i").unwrap(), &to_i32).err().unwrap().to_string();
        assert!(err.contains("tensor `i` is i64 but i32 is needed"), "{err}");
        let pack = MaterializeOptions { dtype: DTypeRule::Keep, packing: Packing::Gemm };
        let err = CpuBackend::materialize(ck.lease("w").unwrap(), &pack).err().unwrap().to_string();
        assert!(err.contains("weight `w` (f32[2]) cannot be packed"), "{err}");
    }

    #[test]
    fn sharing_copies_nothing_and_needs_no_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut file = br#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#.to_vec();
        while !file.len().is_multiple_of(8) {
            file.push(b' ');
        }
        let mut bytes = (file.len() as u64).to_le_bytes().to_vec();
        bytes.extend(file);
        bytes.extend(data);
        std::fs::write(&path, bytes).unwrap();
        let ck = Checkpoint::open(&path).unwrap();
        let options = MaterializeOptions { dtype: DTypeRule::Keep, packing: Packing::Gemm };
        let w = CpuBackend::finish_materialization(CpuBackend::materialize(ck.lease("w").unwrap(), &options).unwrap())
            .unwrap();
        // The checkpoint and its file are gone: sharing cannot re-read anything.
        drop(ck);
        std::fs::remove_file(&path).unwrap();
        let shared = CpuBackend::share_materialized_weight(&w).unwrap();
        assert!(Arc::ptr_eq(shared.tensor(), w.tensor()));
        assert_eq!(shared.tensor().as_bytes().as_ptr(), w.tensor().as_bytes().as_ptr());
        assert!(Arc::ptr_eq(shared.packed().unwrap(), w.packed().unwrap()));
    }

    #[test]
    fn recipes_materialize_as_weights() {
        let ck = MemoryCheckpoint::new("mem").with("a", &f32s(&[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]));
        let recipe =
            DerivedWeightRecipe::Transpose { source: Box::new(DerivedWeightRecipe::tensor("a")), perm: vec![1, 0] };
        let options = MaterializeOptions { dtype: DTypeRule::Exactly(DType::F32), packing: Packing::Gemm };
        let m = CpuBackend::materialize_recipe(&recipe, &ck, &options).unwrap();
        let w = CpuBackend::finish_materialization(m).unwrap();
        assert_eq!(w.tensor().as_ref(), &f32s(&[3, 2], &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]));
        assert_eq!(w.packed().map(|p| (p.k(), p.n())), Some((3, 2)));
        let bad = DerivedWeightRecipe::tensor("b");
        assert!(CpuBackend::materialize_recipe(&bad, &ck, &options).is_err());
    }

    #[test]
    fn validate_bind_rejects_misfits_and_bind_follows_validation() {
        let ck = MemoryCheckpoint::new("mem").with("w", &f32s(&[2, 3], &[0.0; 6])).with("v", &f32s(&[3, 2], &[0.0; 6]));
        let get = |name: &str| {
            CpuBackend::finish_materialization(
                CpuBackend::materialize(ck.lease(name).unwrap(), &MaterializeOptions::default()).unwrap(),
            )
            .unwrap()
        };
        let mut p = slot("w", "f32:2x3", Packing::None);
        let err = CpuBackend::validate_bind(&p, &get("v")).unwrap_err().to_string();
        assert!(err.contains("weight `w` should be f32[2,3], got f32[3,2]"), "{err}");
        let wrong_dtype = slot("w", "f16:2x3", Packing::None);
        assert!(CpuBackend::validate_bind(&wrong_dtype, &get("w")).is_err());
        let w = get("w");
        CpuBackend::validate_bind(&p, &w).unwrap();
        CpuBackend::bind(&mut p, CpuBackend::share_materialized_weight(&w).unwrap()).unwrap();
        assert!(Arc::ptr_eq(p.weight().unwrap().tensor(), w.tensor()));
    }
}
