//! Transfer: moving weights between host storage and a backend's execution storage without changing what they
//! mean.
//!
//! *Promote* takes a backend-owned host buffer and gives an execution weight (a device upload on a GPU; on the
//! CPU, aligned storage and, on request, a pre-packed GEMM operand). *Demote* gives the host buffer back. Both
//! return a `Transfer`: an exact [`Completion`] that also retains every source and destination buffer until the
//! copy is done, so the caller may drop its own handles right away. A demote after a promote gives back the
//! same bytes, bit for bit.

use crate::contract::{Completion, ParameterBackend, SubmissionBackend};

/// A backend that promotes host storage to execution weights and demotes them back.
pub trait TransferBackend: SubmissionBackend + ParameterBackend {
    /// Backend-owned host storage (dtype, shape, bytes, and how the weight should be laid out when promoted).
    type HostBuffer;
    /// An in-flight transfer: completes exactly when the copy has, and retains its buffers until then.
    type Transfer: Completion<Error = Self::TransferError>;
    /// Why a transfer failed.
    type TransferError: std::error::Error + Send + Sync + 'static;

    /// Promotes `host` into an execution weight, ordered on `executor`. The weight may be used by work ordered
    /// after the returned transfer.
    fn promote(
        executor: &Self::Executor,
        host: &Self::HostBuffer,
    ) -> Result<(Self::MaterializedWeight, Self::Transfer), Self::TransferError>;

    /// Demotes `weight` into host storage, ordered on `executor`. The host buffer holds the weight's bytes once
    /// the returned transfer has completed.
    fn demote(
        executor: &Self::Executor,
        weight: &Self::MaterializedWeight,
    ) -> Result<(Self::HostBuffer, Self::Transfer), Self::TransferError>;
}
