//! Submission: independently schedulable executors on one device, and exact completions for their work.
//!
//! An *executor* is an in-order lane of work (a CPU worker thread, a CUDA stream). Work submitted to one executor
//! runs in submission order; work on different executors is unordered unless [`SubmissionBackend::order_after`]
//! says otherwise. Values that work reads can be handed to [`SubmissionBackend::retain_until_complete`], which
//! keeps them alive until exactly that completion and then drops them — the submitter need not keep them.

use crate::contract::Completion;

/// A backend that accepts submitted work on executors.
pub trait SubmissionBackend {
    /// An executor: a queue, stream or lane.
    type Executor: ?Sized;
    /// An owned executor for one independently schedulable lane.
    type OwnedExecutor: std::borrow::Borrow<Self::Executor> + Send + Sync;
    /// The exact completion of one submission.
    type Completion: Completion;
    /// What can be submitted: backend-native work (a compiled program with its inputs, a job).
    type Work;

    /// Creates `count` new executors on the same device as `executor`, each independently schedulable.
    fn fork_executors(
        executor: &Self::Executor,
        count: usize,
    ) -> Result<Vec<Self::OwnedExecutor>, <Self::Completion as Completion>::Error>;

    /// Submits `work` to run on `executor` after everything submitted there before it.
    fn submit(
        executor: &Self::Executor,
        work: Self::Work,
    ) -> Result<Self::Completion, <Self::Completion as Completion>::Error>;

    /// Orders all work submitted to `executor` from now on after `completion`. If that work failed, the next
    /// submission on `executor` does not run and reports the producer's failure instead.
    fn order_after(
        completion: &Self::Completion,
        executor: &Self::Executor,
    ) -> Result<(), <Self::Completion as Completion>::Error>;

    /// Keeps `value` alive until `completion` has completed, then drops it (immediately, if it already has).
    fn retain_until_complete<T: Send + 'static>(
        executor: &Self::Executor,
        completion: &Self::Completion,
        value: T,
    ) -> Result<(), <Self::Completion as Completion>::Error>;
}
