//! Collectives: all-reduce, all-gather and all-to-all over a group of ranks.
//!
//! Every rank of a group calls the same collective with a tensor of the same dtype and shape; each gets the
//! result. The semantics are fixed here so that every implementation (threads in one process, MPI across
//! processes, NCCL on GPUs) agrees:
//! - `all_reduce(x, op)`: elementwise `op` over the ranks' tensors; same shape as `x`.
//! - `all_gather(x)`: the ranks' tensors concatenated along axis 0 in rank order (`[n·d0, …]`; a scalar becomes
//!   `[n]`).
//! - `all_to_all(x)`: `x`'s axis 0 split into `n` equal chunks; chunk `j` goes to rank `j`; each rank's result
//!   is the chunks it received, concatenated along axis 0 in sender-rank order (same shape as `x`).
//!
//! A rank whose tensor disagrees with the others' (dtype, shape, or which collective it called) gets an error,
//! and so do the others — a collective either succeeds everywhere or fails everywhere.

use crate::contract::SubmissionBackend;

/// The elementwise reduction of an all-reduce.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (integers wrap; floats add in rank order where the implementation controls the order).
    Sum,
    /// Maximum (a NaN anywhere gives NaN).
    Max,
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
        })
    }
}

/// A member's view of its group.
pub trait CollectiveGroup {
    /// This member's rank, `0..size`.
    fn rank(&self) -> usize;
    /// How many ranks the group has.
    fn size(&self) -> usize;
}

/// A backend with collective operations over groups of its executors.
pub trait CollectiveBackend: SubmissionBackend {
    /// The tensors collectives move.
    type Tensor;
    /// One member's handle to a group.
    type Group: CollectiveGroup + ?Sized;
    /// Why a collective failed.
    type CollectiveError: std::error::Error + Send + Sync + 'static;

    /// Reduces `value` elementwise with `op` across the group; every rank gets the result. Runs on `executor`
    /// after the work already submitted there.
    fn all_reduce(
        value: Self::Tensor,
        op: ReduceOp,
        group: &Self::Group,
        executor: &Self::Executor,
    ) -> Result<Self::Tensor, Self::CollectiveError>;

    /// Concatenates every rank's `value` along axis 0, in rank order.
    fn all_gather(
        value: Self::Tensor,
        group: &Self::Group,
        executor: &Self::Executor,
    ) -> Result<Self::Tensor, Self::CollectiveError>;

    /// Sends chunk `j` of `value`'s axis 0 to rank `j`; returns the received chunks in sender order.
    fn all_to_all(
        value: Self::Tensor,
        group: &Self::Group,
        executor: &Self::Executor,
    ) -> Result<Self::Tensor, Self::CollectiveError>;
}
