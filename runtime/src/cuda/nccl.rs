//! Collectives across GPUs through NCCL (the `CollectiveBackend` contract), loaded at run time like the driver.
//!
//! A group is an NCCL communicator: every member calls [`NcclGroup::new`] with its rank, the group's size and the
//! same [`NcclId`] (made once by one member, [`NcclId::new`], and passed to the others out of band — its 128
//! bytes, [`NcclId::to_bytes`]); [`NcclGroup::single`] is a group of one. Collectives are queued on the
//! executor's stream after the work already submitted there, into a new device tensor (the operand is shared, so
//! it is never overwritten), and complete with the stream: order other work after them with the executor's
//! completions. A machine without `libnccl.so` gets a clear error, never cudarc's panic.

use std::ffi::c_void;

use cudarc::nccl::sys as nccl;
use kiln_ir::DType;

use super::driver::CudaGpu;
use super::parameters::GpuWeight;
use super::submission::{GpuBackend, GpuExecutor};
use crate::RunError;
use crate::contract::{CollectiveBackend, CollectiveGroup, ReduceOp};

fn collective_error(message: impl std::fmt::Display) -> RunError {
    RunError::Collective(format!("nccl: {message}"))
}

/// Checks that NCCL can be loaded (cudarc panics on a call into a library it cannot load).
fn probe() -> Result<(), RunError> {
    // SAFETY: probing only tries to load the library; it calls nothing in it.
    if unsafe { nccl::is_culib_present() } {
        Ok(())
    } else {
        Err(RunError::NoDevice {
            backend: "cuda".into(),
            reason: "NCCL (libnccl.so) was not found: install NCCL or put its folder on LD_LIBRARY_PATH".into(),
        })
    }
}

/// A communicator's identity, shared by every member of a group.
#[derive(Clone)]
pub struct NcclId(nccl::ncclUniqueId);

impl NcclId {
    /// A new identity (one member makes it and hands it to the others).
    pub fn new() -> Result<NcclId, RunError> {
        probe()?;
        cudarc::nccl::result::get_uniqueid().map(NcclId).map_err(|e| collective_error(format!("{e:?}")))
    }

    /// Its 128 bytes, to pass to the other members.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0.internal.map(|c| c as u8)
    }

    /// The identity from [`NcclId::to_bytes`]'s bytes.
    pub fn from_bytes(bytes: [u8; 128]) -> NcclId {
        NcclId(nccl::ncclUniqueId { internal: bytes.map(|b| b as std::ffi::c_char) })
    }
}

/// One member's handle on an NCCL group. See the module docs.
pub struct NcclGroup {
    comm: nccl::ncclComm_t,
    rank: usize,
    size: usize,
}

// SAFETY: a communicator may be used from any thread; kiln queues on it from one executor at a time (the
// contract's calls take `&self` but NCCL serializes a communicator's operations on their streams).
unsafe impl Send for NcclGroup {}
// SAFETY: as above.
unsafe impl Sync for NcclGroup {}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { cudarc::nccl::result::comm_destroy(self.comm) };
    }
}

impl NcclGroup {
    /// Joins the group `id` as `rank` of `size`, on `gpu`'s device (blocks until every member has joined).
    pub fn new(gpu: &CudaGpu, rank: usize, size: usize, id: &NcclId) -> Result<NcclGroup, RunError> {
        probe()?;
        if rank >= size {
            return Err(collective_error(format!("rank {rank} is not in a group of {size}")));
        }
        let n = i32::try_from(size).map_err(|_| collective_error(format!("a group of {size} is too large")))?;
        gpu.device().context().bind_to_thread().map_err(|e| collective_error(format!("binding the context: {e}")))?;
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: `comm` receives the communicator; the id is the group's, the rank in range.
        unsafe { cudarc::nccl::result::comm_init_rank(comm.as_mut_ptr(), n, id.0, rank as i32) }
            .map_err(|e| collective_error(format!("joining the group as rank {rank} of {size}: {e:?}")))?;
        // SAFETY: initialized by the successful call above.
        Ok(NcclGroup { comm: unsafe { comm.assume_init() }, rank, size })
    }

    /// A group of one (collectives are copies): for one GPU, and for testing the path.
    pub fn single(gpu: &CudaGpu) -> Result<NcclGroup, RunError> {
        NcclGroup::new(gpu, 0, 1, &NcclId::new()?)
    }
}

impl CollectiveGroup for NcclGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }
}

fn nccl_type(dtype: DType) -> Result<nccl::ncclDataType_t, RunError> {
    use nccl::ncclDataType_t as T;
    Ok(match dtype {
        DType::F32 => T::ncclFloat32,
        DType::F64 => T::ncclFloat64,
        DType::F16 => T::ncclFloat16,
        DType::BF16 => T::ncclBfloat16,
        DType::I32 => T::ncclInt32,
        DType::I64 => T::ncclInt64,
        DType::I8 => T::ncclInt8,
        DType::U8 => T::ncclUint8,
        other => return Err(collective_error(format!("no NCCL type for {other}"))),
    })
}

fn stream(executor: &GpuExecutor<CudaGpu>) -> nccl::cudaStream_t {
    executor.gpu().raw_stream() as nccl::cudaStream_t
}

impl CollectiveBackend for GpuBackend<CudaGpu> {
    type Tensor = GpuWeight<CudaGpu>;
    type Group = NcclGroup;
    type CollectiveError = RunError;

    fn all_reduce(
        value: GpuWeight<CudaGpu>,
        op: ReduceOp,
        group: &NcclGroup,
        executor: &GpuExecutor<CudaGpu>,
    ) -> Result<GpuWeight<CudaGpu>, RunError> {
        let ty = nccl_type(value.dtype())?;
        let out = GpuWeight::alloc(executor.gpu(), value.dtype(), value.shape())?;
        let count = value.shape().iter().product();
        let op = match op {
            ReduceOp::Sum => nccl::ncclRedOp_t::ncclSum,
            ReduceOp::Max => nccl::ncclRedOp_t::ncclMax,
        };
        // SAFETY: both buffers hold `count` elements of `ty`; the output is new, so it overlaps nothing.
        unsafe {
            cudarc::nccl::result::all_reduce(
                value.ptr().0 as *const c_void,
                out.ptr().0 as *mut c_void,
                count,
                ty,
                op,
                group.comm,
                stream(executor),
            )
        }
        .map_err(|e| collective_error(format!("all_reduce: {e:?}")))?;
        Ok(out)
    }

    fn all_gather(
        value: GpuWeight<CudaGpu>,
        group: &NcclGroup,
        executor: &GpuExecutor<CudaGpu>,
    ) -> Result<GpuWeight<CudaGpu>, RunError> {
        let ty = nccl_type(value.dtype())?;
        let mut shape = value.shape().to_vec();
        let Some(first) = shape.first_mut() else {
            return Err(collective_error("all_gather concatenates along axis 0: a scalar has none"));
        };
        *first *= group.size;
        let out = GpuWeight::alloc(executor.gpu(), value.dtype(), &shape)?;
        let count = value.shape().iter().product();
        // SAFETY: the output holds `size` times the operand's elements, in rank order.
        unsafe {
            cudarc::nccl::result::all_gather(
                value.ptr().0 as *const c_void,
                out.ptr().0 as *mut c_void,
                count,
                ty,
                group.comm,
                stream(executor),
            )
        }
        .map_err(|e| collective_error(format!("all_gather: {e:?}")))?;
        Ok(out)
    }

    fn all_to_all(
        value: GpuWeight<CudaGpu>,
        group: &NcclGroup,
        executor: &GpuExecutor<CudaGpu>,
    ) -> Result<GpuWeight<CudaGpu>, RunError> {
        let ty = nccl_type(value.dtype())?;
        let rows = value.shape().first().copied().unwrap_or(0);
        if value.shape().is_empty() || !rows.is_multiple_of(group.size) {
            return Err(collective_error(format!(
                "all_to_all splits axis 0 into {} chunks: {:?} does not split",
                group.size,
                value.shape()
            )));
        }
        let out = GpuWeight::alloc(executor.gpu(), value.dtype(), value.shape())?;
        let count: usize = value.shape().iter().product::<usize>() / group.size;
        let chunk = count * value.dtype().size_bytes();
        let s = stream(executor);
        cudarc::nccl::result::group_start().map_err(|e| collective_error(format!("all_to_all: {e:?}")))?;
        let mut result = Ok(());
        for peer in 0..group.size {
            // SAFETY: chunk `peer` of each buffer holds `count` elements; the output is new.
            let r = unsafe {
                cudarc::nccl::result::send(
                    value.ptr().offset(peer * chunk).0 as *const c_void,
                    count,
                    ty,
                    peer as i32,
                    group.comm,
                    s,
                )
                .and_then(|_| {
                    cudarc::nccl::result::recv(
                        out.ptr().offset(peer * chunk).0 as *mut c_void,
                        count,
                        ty,
                        peer as i32,
                        group.comm,
                        s,
                    )
                })
            };
            if let Err(e) = r {
                result = Err(collective_error(format!("all_to_all with rank {peer}: {e:?}")));
                break;
            }
        }
        // The group is closed whatever happened inside it.
        let ended = cudarc::nccl::result::group_end().map_err(|e| collective_error(format!("all_to_all: {e:?}")));
        result.and(ended.map(drop))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_their_bytes() {
        let bytes: [u8; 128] = std::array::from_fn(|i| (i * 7) as u8);
        assert_eq!(NcclId::from_bytes(bytes).to_bytes(), bytes);
    }

    #[test]
    fn without_nccl_a_new_id_is_a_clear_error_not_a_panic() {
        match NcclId::new() {
            Ok(id) => assert_eq!(id.to_bytes().len(), 128),
            Err(e) => assert!(e.to_string().contains("NCCL") || e.to_string().contains("nccl"), "{e}"),
        }
    }
}
