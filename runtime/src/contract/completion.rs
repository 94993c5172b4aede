//! Exact completions: the one thing a submitter may wait on.
//!
//! A completion stands for exactly one submission. It becomes ready when that work has finished — not when some
//! later batch happens to finish — and then reports its outcome. Completions are cheap handles (clone them to wait
//! from several places) and never block the submitter: waiting is always explicit.

/// The outcome of one submitted piece of work.
pub trait Completion: Clone + Send + Sync + 'static {
    /// Why the work failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Blocks until the work has finished; `Ok` when it succeeded.
    fn wait(&self) -> Result<(), Self::Error>;

    /// The outcome if the work has finished, `None` while it is still pending. Never blocks.
    fn poll(&self) -> Option<Result<(), Self::Error>>;

    /// Whether the work has finished (successfully or not).
    fn is_complete(&self) -> bool {
        self.poll().is_some()
    }
}
