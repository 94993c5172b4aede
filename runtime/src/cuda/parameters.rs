//! Parameters and transfers on a GPU (the `ParameterBackend` and `TransferBackend` contracts).
//!
//! A [`GpuWeight`] is a device allocation holding one tensor (shared by clones, freed with the last one).
//! [`ParameterBackend::materialize`] copies a checkpoint tensor's bytes to the device on the executor given as
//! the context, straight from the checkpoint's mapping (the lease is held until the copy has completed:
//! [`ParameterBackend::finish_materialization`] waits for it, then releases the lease). A derived-weight recipe is
//! evaluated on the host, then copied.
//!
//! [`TransferBackend::promote`] copies a [`GpuHostBuffer`] to a new device weight and returns the copy's
//! completion; [`TransferBackend::demote`] copies a weight into pinned host memory without the host waiting —
//! its bytes are readable once the returned completion is complete ([`GpuHostBuffer::bytes`] waits for it).

use std::sync::Arc;

use kiln_ir::{DType, Dim, Tensor, TensorType};

use super::gpu::{DevPtr, Gpu};
use super::submission::{GpuBackend, GpuCompletion, GpuExecutor};
use crate::RunError;
use crate::checkpoint::{CheckpointLease, CheckpointSource};
use crate::contract::{Completion, ParameterBackend, TransferBackend};
use crate::recipe::DerivedWeightRecipe;

struct Allocation<G: Gpu> {
    gpu: G,
    ptr: DevPtr,
}

impl<G: Gpu> Drop for Allocation<G> {
    fn drop(&mut self) {
        // Queued work that reads the weight was queued before the last handle went away; wait for it.
        if self.gpu.synchronize().is_ok() {
            // SAFETY: allocated for this weight, freed once, with the queue drained.
            unsafe { self.gpu.free(self.ptr) };
        }
    }
}

/// A tensor on the device. Clones share the allocation.
pub struct GpuWeight<G: Gpu> {
    allocation: Arc<Allocation<G>>,
    dtype: DType,
    shape: Vec<usize>,
}

impl<G: Gpu> Clone for GpuWeight<G> {
    fn clone(&self) -> Self {
        GpuWeight { allocation: Arc::clone(&self.allocation), dtype: self.dtype, shape: self.shape.clone() }
    }
}

impl<G: Gpu> std::fmt::Debug for GpuWeight<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuWeight({} {:?} at {:#x})", self.dtype, self.shape, self.allocation.ptr.0)
    }
}

impl<G: Gpu> GpuWeight<G> {
    /// Its device address.
    pub fn ptr(&self) -> DevPtr {
        self.allocation.ptr
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The extents.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size_bytes()
    }

    /// A new, uninitialized device tensor on `gpu` (for results device work writes).
    pub(crate) fn alloc(gpu: &G, dtype: DType, shape: &[usize]) -> Result<GpuWeight<G>, RunError> {
        let bytes = shape.iter().product::<usize>() * dtype.size_bytes();
        let ptr = gpu.alloc(bytes)?;
        Ok(GpuWeight { allocation: Arc::new(Allocation { gpu: gpu.clone(), ptr }), dtype, shape: shape.to_vec() })
    }

    /// Queues a copy of `bytes` (a tensor of `dtype` and `shape`) into a new device allocation on `gpu`.
    fn upload(gpu: &G, dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<GpuWeight<G>, RunError> {
        check_bytes(dtype, shape, bytes)?;
        let ptr = gpu.alloc(bytes.len())?;
        let allocation = Arc::new(Allocation { gpu: gpu.clone(), ptr });
        // SAFETY: the allocation holds `bytes.len()` bytes.
        unsafe { gpu.upload(ptr, bytes)? };
        Ok(GpuWeight { allocation, dtype, shape: shape.to_vec() })
    }
}

fn transfer_error(message: String) -> RunError {
    RunError::Submission(format!("transfer: {message}"))
}

/// Checks that `bytes` hold a tensor of `dtype` and `shape` (bools as 0 or 1).
fn check_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<(), RunError> {
    let elements = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if elements.and_then(|n| n.checked_mul(dtype.size_bytes())) != Some(bytes.len()) {
        return Err(transfer_error(format!("{} bytes do not hold {dtype} {shape:?}", bytes.len())));
    }
    if dtype == DType::Bool && bytes.iter().any(|&b| b > 1) {
        return Err(transfer_error(format!("{dtype} {shape:?}: a bool byte is neither 0 nor 1")));
    }
    Ok(())
}

/// A weight slot of a GPU program: its name, its type, and the weight bound to it.
pub struct GpuParameter<G: Gpu> {
    /// The weight's name.
    pub name: String,
    /// The type the program expects.
    pub ty: TensorType,
    /// The bound weight.
    pub weight: Option<GpuWeight<G>>,
}

/// A weight being copied to the device, with the checkpoint lease it reads from.
pub struct GpuMaterialization<G: Gpu> {
    weight: GpuWeight<G>,
    /// Complete once the copy is.
    copied: GpuCompletion<G>,
    lease: Option<CheckpointLease>,
}

impl<G: Gpu + 'static> ParameterBackend for GpuBackend<G> {
    type Parameter = GpuParameter<G>;
    type MaterializedWeight = GpuWeight<G>;
    type MaterializationContext = GpuExecutor<G>;
    type Materialization = GpuMaterialization<G>;
    type ParameterError = RunError;

    fn materialize(lease: CheckpointLease, executor: &GpuExecutor<G>) -> Result<GpuMaterialization<G>, RunError> {
        let weight = GpuWeight::upload(executor.gpu(), lease.dtype(), lease.shape(), lease.bytes())
            .map_err(|e| RunError::Weights(format!("{}: tensor `{}`: {e}", lease.origin(), lease.name())))?;
        Ok(GpuMaterialization { weight, copied: executor.mark()?, lease: Some(lease) })
    }

    fn materialize_recipe(
        recipe: &DerivedWeightRecipe,
        source: &dyn CheckpointSource,
        executor: &GpuExecutor<G>,
    ) -> Result<GpuMaterialization<G>, RunError> {
        let tensor = recipe.evaluate(source)?;
        let weight = GpuWeight::upload(executor.gpu(), tensor.dtype(), tensor.shape(), tensor.as_bytes())?;
        Ok(GpuMaterialization { weight, copied: executor.mark()?, lease: None })
    }

    fn materialized_weight(materialization: &GpuMaterialization<G>) -> &GpuWeight<G> {
        &materialization.weight
    }

    fn finish_materialization(materialization: GpuMaterialization<G>) -> Result<GpuWeight<G>, RunError> {
        let GpuMaterialization { weight, copied, lease } = materialization;
        copied.wait()?;
        // The device holds its own copy now: the mapping's share can go.
        drop(lease);
        Ok(weight)
    }

    fn share_materialized_weight(weight: &GpuWeight<G>) -> Result<GpuWeight<G>, RunError> {
        Ok(weight.clone())
    }

    fn validate_bind(parameter: &GpuParameter<G>, weight: &GpuWeight<G>) -> Result<(), RunError> {
        let ty = &parameter.ty;
        let fits_shape = ty.shape.0.len() == weight.shape.len()
            && ty.shape.0.iter().zip(&weight.shape).all(|(d, &n)| match d {
                Dim::Static(s) => *s == n as u64,
                Dim::Sym(_) => false,
            });
        if weight.dtype != ty.dtype || !fits_shape {
            return Err(RunError::Weights(format!(
                "weight `{}` should be {ty}, got {} {:?}",
                parameter.name, weight.dtype, weight.shape
            )));
        }
        Ok(())
    }

    fn bind(parameter: &mut GpuParameter<G>, weight: GpuWeight<G>) -> Result<(), RunError> {
        parameter.weight = Some(weight);
        Ok(())
    }
}

/// Host-side bytes of a tensor: given by the caller, or copied from the device by [`TransferBackend::demote`].
pub struct GpuHostBuffer<G: Gpu> {
    /// The element type.
    pub dtype: DType,
    /// The extents.
    pub shape: Vec<usize>,
    data: HostData<G>,
}

enum HostData<G: Gpu> {
    Plain(Vec<u8>),
    Device { gpu: G, buffer: G::HostBuffer, copied: GpuCompletion<G> },
}

impl<G: Gpu + 'static> GpuHostBuffer<G> {
    /// A buffer holding `tensor`'s bytes.
    pub fn from_tensor(tensor: &Tensor) -> GpuHostBuffer<G> {
        GpuHostBuffer {
            dtype: tensor.dtype(),
            shape: tensor.shape().to_vec(),
            data: HostData::Plain(tensor.as_bytes().to_vec()),
        }
    }

    /// The bytes, once any copy into them has completed (this waits for it).
    pub fn bytes(&self) -> Result<&[u8], RunError> {
        match &self.data {
            HostData::Plain(v) => Ok(v),
            HostData::Device { gpu, buffer, copied } => {
                copied.wait()?;
                let n = self.shape.iter().product::<usize>() * self.dtype.size_bytes();
                Ok(&gpu.host_bytes(buffer)[..n])
            }
        }
    }

    /// The bytes as a tensor (waiting for any copy).
    pub fn to_tensor(&self) -> Result<Tensor, RunError> {
        Tensor::from_bytes(self.dtype, self.shape.clone(), self.bytes()?)
            .ok_or_else(|| transfer_error(format!("the bytes do not hold {} {:?}", self.dtype, self.shape)))
    }
}

impl<G: Gpu + 'static> TransferBackend for GpuBackend<G> {
    type HostBuffer = GpuHostBuffer<G>;
    type Transfer = GpuCompletion<G>;
    type TransferError = RunError;

    fn promote(
        executor: &GpuExecutor<G>,
        host: &GpuHostBuffer<G>,
    ) -> Result<(GpuWeight<G>, GpuCompletion<G>), RunError> {
        let weight = GpuWeight::upload(executor.gpu(), host.dtype, &host.shape, host.bytes()?)?;
        Ok((weight, executor.mark()?))
    }

    fn demote(
        executor: &GpuExecutor<G>,
        weight: &GpuWeight<G>,
    ) -> Result<(GpuHostBuffer<G>, GpuCompletion<G>), RunError> {
        let gpu = executor.gpu();
        let mut buffer = gpu.alloc_host(weight.bytes())?;
        // SAFETY: the weight holds `bytes()` bytes and so does `buffer`, which the returned host buffer keeps
        // unread until `copied` is complete.
        unsafe { gpu.download_async(weight.ptr(), &mut buffer, weight.bytes())? };
        let copied = executor.mark()?;
        let host = GpuHostBuffer {
            dtype: weight.dtype,
            shape: weight.shape.clone(),
            data: HostData::Device { gpu: gpu.clone(), buffer, copied: copied.clone() },
        };
        Ok((host, copied))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::MemoryCheckpoint;
    use crate::cuda::{HostGpu, NoKernels};

    type Host = HostGpu<NoKernels>;

    fn executor() -> GpuExecutor<Host> {
        GpuExecutor::new("gpu0", HostGpu::new(NoKernels))
    }

    #[test]
    fn checkpoint_tensors_materialize_on_the_device_and_bind_by_type() {
        let e = executor();
        let w = Tensor::from_vec(vec![2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let ckpt = MemoryCheckpoint::new("mem").with("w", &w);
        let lease = ckpt.lease("w").unwrap();
        let m = GpuBackend::materialize(lease, &e).unwrap();
        assert_eq!(GpuBackend::materialized_weight(&m).shape(), &[2, 2]);
        let weight = GpuBackend::finish_materialization(m).unwrap();
        let mut slot = GpuParameter { name: "w".into(), ty: TensorType::of(DType::F32, &[2, 2]), weight: None };
        GpuBackend::validate_bind(&slot, &weight).unwrap();
        GpuBackend::bind(&mut slot, GpuBackend::share_materialized_weight(&weight).unwrap()).unwrap();
        let (back, done) = GpuBackend::demote(&e, slot.weight.as_ref().unwrap()).unwrap();
        done.wait().unwrap();
        assert_eq!(back.to_tensor().unwrap(), w);
        let wrong = GpuParameter::<Host> { name: "w".into(), ty: TensorType::of(DType::F32, &[4]), weight: None };
        let err = GpuBackend::validate_bind(&wrong, &weight).unwrap_err();
        assert!(err.to_string().contains("weight `w` should be f32[4]"), "{err}");
    }

    #[test]
    fn promote_and_demote_round_trip_and_refuse_bad_bytes() {
        let e = executor();
        let t = Tensor::from_vec(vec![3], vec![true, false, true]).unwrap();
        let (w, done) = GpuBackend::promote(&e, &GpuHostBuffer::from_tensor(&t)).unwrap();
        done.wait().unwrap();
        let (host, _) = GpuBackend::demote(&e, &w).unwrap();
        assert_eq!(host.to_tensor().unwrap(), t);
        let bad = GpuHostBuffer::<Host> { dtype: DType::Bool, shape: vec![2], data: HostData::Plain(vec![0, 7]) };
        assert!(GpuBackend::promote(&e, &bad).unwrap_err().to_string().contains("neither 0 nor 1"));
        let short = GpuHostBuffer::<Host> { dtype: DType::F32, shape: vec![2], data: HostData::Plain(vec![0; 7]) };
        assert!(GpuBackend::promote(&e, &short).unwrap_err().to_string().contains("7 bytes do not hold f32 [2]"));
        // The weights' device memory goes with the last handle.
        let gpu = e.gpu().clone();
        drop((w, host));
        assert_eq!(gpu.allocated_bytes(), 0);
    }
}
