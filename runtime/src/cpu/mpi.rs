//! Collectives across processes through MPI (feature `mpi`): the same semantics as [`LocalGroup`]'s, on the
//! system's MPI library (OpenMPI on Debian) through the `mpi` crate.
//!
//! Every collective first all-gathers a small fixed-size header (which collective, the reduce op, dtype, shape)
//! and checks that all ranks agree, so a mismatch is the same clear error on every rank instead of MPI's
//! undefined behaviour. Payloads then move as one MPI call: `MPI_Allreduce` on the native element type (half
//! precision widened to f32 and rounded once), `MPI_Allgather` / `MPI_Alltoall` on bytes.
//!
//! MPI handles are not `Send`, so a collective runs on the caller's thread after the executor has finished the
//! work submitted before it (the executor's order is kept; the caller blocks, as with any MPI collective). MPI is
//! initialized with `MPI_THREAD_SERIALIZED`: callers on several threads must not overlap collectives of one group.
//!
//! [`LocalGroup`]: crate::cpu::LocalGroup

use kiln_ir::tensor::Data;
use kiln_ir::{DType, Tensor};
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::RunError;
use crate::contract::{CollectiveBackend, CollectiveGroup, Completion, ReduceOp, SubmissionBackend};
use crate::cpu::collective::{Collective, chunk_rows};
use crate::cpu::{CpuBackend, CpuCompletion, CpuExecutor, CpuWork};

/// Most dims a tensor in an MPI collective may have (the header is fixed-size).
const MAX_RANK: usize = 8;

/// This process's membership of the MPI world: initializes MPI on creation, finalizes it on drop.
pub struct MpiGroup {
    world: SimpleCommunicator,
    // Declared last: dropped after the communicator, it finalizes MPI.
    _universe: Universe,
}

impl std::fmt::Debug for MpiGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MpiGroup(rank {} of {})", self.rank(), self.size())
    }
}

impl MpiGroup {
    /// Initializes MPI (once per process) and joins the world group.
    pub fn world() -> Result<MpiGroup, RunError> {
        let (universe, level) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .ok_or_else(|| RunError::Collective("MPI is already initialized in this process".into()))?;
        if level < mpi::Threading::Serialized {
            return Err(RunError::Collective(format!(
                "the MPI library offers thread level {level:?}; kiln needs at least Serialized"
            )));
        }
        Ok(MpiGroup { world: universe.world(), _universe: universe })
    }
}

impl CollectiveGroup for MpiGroup {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }
}

/// The MPI backend: CPU executors for submission, MPI for collectives.
#[derive(Copy, Clone, Debug, Default)]
pub struct MpiBackend;

impl SubmissionBackend for MpiBackend {
    type Executor = CpuExecutor;
    type OwnedExecutor = CpuExecutor;
    type Completion = CpuCompletion;
    type Work = CpuWork;

    fn fork_executors(executor: &CpuExecutor, count: usize) -> Result<Vec<CpuExecutor>, RunError> {
        CpuBackend::fork_executors(executor, count)
    }

    fn submit(executor: &CpuExecutor, work: CpuWork) -> Result<CpuCompletion, RunError> {
        CpuBackend::submit(executor, work)
    }

    fn order_after(completion: &CpuCompletion, executor: &CpuExecutor) -> Result<(), RunError> {
        CpuBackend::order_after(completion, executor)
    }

    fn retain_until_complete<T: Send + 'static>(
        executor: &CpuExecutor,
        completion: &CpuCompletion,
        value: T,
    ) -> Result<(), RunError> {
        CpuBackend::retain_until_complete(executor, completion, value)
    }
}

fn dtype_code(d: DType) -> i64 {
    DType::ALL.iter().position(|x| *x == d).map_or(-1, |i| i as i64)
}

fn collective_code(c: Collective) -> [i64; 2] {
    match c {
        Collective::AllReduce(ReduceOp::Sum) => [0, 0],
        Collective::AllReduce(ReduceOp::Max) => [0, 1],
        Collective::AllGather => [1, 0],
        Collective::AllToAll => [2, 0],
    }
}

/// Waits for the executor's earlier work, then checks that every rank calls the same collective on the same
/// dtype and shape.
fn agree(group: &MpiGroup, executor: &CpuExecutor, what: Collective, value: &Tensor) -> Result<(), RunError> {
    executor.submit(|| Ok(()))?.wait()?;
    if value.shape().len() > MAX_RANK {
        return Err(RunError::Collective(format!(
            "{what}: rank-{} tensors are not supported (at most {MAX_RANK})",
            value.shape().len()
        )));
    }
    let mut header = [-1i64; 4 + MAX_RANK];
    header[..2].copy_from_slice(&collective_code(what));
    header[2] = dtype_code(value.dtype());
    header[3] = value.shape().len() as i64;
    for (h, &d) in header[4..].iter_mut().zip(value.shape()) {
        *h = d as i64;
    }
    let mut all = vec![0i64; header.len() * group.size()];
    group.world.all_gather_into(&header[..], &mut all[..]);
    for (rank, theirs) in all.chunks(header.len()).enumerate() {
        if theirs != header {
            return Err(RunError::Collective(format!(
                "{what}: ranks disagree: rank {} called with {}{:?}, rank {rank} with header {theirs:?}",
                group.rank(),
                value.dtype(),
                value.shape()
            )));
        }
    }
    Ok(())
}

fn reduce_into<T: Equivalence + Copy + Default>(world: &SimpleCommunicator, v: &[T], op: ReduceOp) -> Vec<T> {
    let mut out = vec![T::default(); v.len()];
    let op = match op {
        ReduceOp::Sum => SystemOperation::sum(),
        ReduceOp::Max => SystemOperation::max(),
    };
    world.all_reduce_into(v, &mut out[..], op);
    out
}

fn bytes_to_tensor(what: Collective, dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Result<Tensor, RunError> {
    Tensor::from_bytes(dtype, shape, bytes)
        .ok_or_else(|| RunError::Collective(format!("{what}: result bytes do not fit the result shape")))
}

impl CollectiveBackend for MpiBackend {
    type Tensor = Tensor;
    type Group = MpiGroup;
    type CollectiveError = RunError;

    fn all_reduce(value: Tensor, op: ReduceOp, group: &MpiGroup, executor: &CpuExecutor) -> Result<Tensor, RunError> {
        let what = Collective::AllReduce(op);
        agree(group, executor, what, &value)?;
        let w = &group.world;
        let data = match value.data() {
            Data::F32(v) => Data::F32(reduce_into(w, v, op)),
            Data::F64(v) => Data::F64(reduce_into(w, v, op)),
            Data::I32(v) => Data::I32(reduce_into(w, v, op)),
            Data::I64(v) => Data::I64(reduce_into(w, v, op)),
            Data::I8(v) => Data::I8(reduce_into(w, v, op)),
            Data::U8(v) => Data::U8(reduce_into(w, v, op)),
            Data::F16(v) => {
                let wide: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
                Data::F16(reduce_into(w, &wide, op).into_iter().map(half::f16::from_f32).collect())
            }
            Data::BF16(v) => {
                let wide: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
                Data::BF16(reduce_into(w, &wide, op).into_iter().map(half::bf16::from_f32).collect())
            }
            Data::I16(v) => Data::I16(reduce_into(w, v, op)),
            Data::U16(v) => Data::U16(reduce_into(w, v, op)),
            Data::U32(v) => Data::U32(reduce_into(w, v, op)),
            Data::U64(v) => Data::U64(reduce_into(w, v, op)),
            Data::Bool(_) => {
                return Err(RunError::Collective(format!("{what}: dtype bool is not supported (cast to u8 first)")));
            }
            Data::F8E4M3FN(_)
            | Data::F8E4M3FNUZ(_)
            | Data::F8E5M2(_)
            | Data::F8E5M2FNUZ(_)
            | Data::F8E8M0(_)
            | Data::F4E2M1(_)
            | Data::I4(_)
            | Data::U4(_)
            | Data::I2(_)
            | Data::U2(_) => {
                return Err(RunError::Collective(format!(
                    "{what}: dtype {} is not supported (cast to a wider type first)",
                    value.dtype()
                )));
            }
        };
        Tensor::new(value.shape().to_vec(), data).map_err(|e| RunError::Collective(format!("{what}: {e}")))
    }

    fn all_gather(value: Tensor, group: &MpiGroup, executor: &CpuExecutor) -> Result<Tensor, RunError> {
        let what = Collective::AllGather;
        agree(group, executor, what, &value)?;
        let bytes = value.as_bytes();
        let mut out = vec![0u8; bytes.len() * group.size()];
        group.world.all_gather_into(bytes, &mut out[..]);
        let mut shape = value.shape().to_vec();
        match shape.first_mut() {
            Some(d0) => *d0 *= group.size(),
            None => shape.push(group.size()),
        }
        bytes_to_tensor(what, value.dtype(), shape, &out)
    }

    fn all_to_all(value: Tensor, group: &MpiGroup, executor: &CpuExecutor) -> Result<Tensor, RunError> {
        let what = Collective::AllToAll;
        agree(group, executor, what, &value)?;
        // Every rank has the same shape (checked), so this fails on all ranks or on none.
        chunk_rows(&value, group.size())?;
        let bytes = value.as_bytes();
        let mut out = vec![0u8; bytes.len()];
        group.world.all_to_all_into(bytes, &mut out[..]);
        bytes_to_tensor(what, value.dtype(), value.shape().to_vec(), &out)
    }
}
