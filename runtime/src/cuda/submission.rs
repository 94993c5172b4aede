//! Submission on a GPU: executors are streams, completions are events, ordering is a stream waiting on an event.
//!
//! A [`GpuExecutor`] is a device handle with a queue of its own ([`Gpu::fork`]: a CUDA stream and a cuBLAS handle
//! on it). [`SubmissionBackend::submit`] runs the work's closure on the calling thread, which *queues* device work
//! on the executor's stream and returns (it blocks only where a step must come back to the host), then records an
//! event: the [`GpuCompletion`]. [`SubmissionBackend::order_after`] makes the consumer's stream wait for the
//! producer's event on the device (`cuStreamWaitEvent`): the host never waits. A producer whose work failed while
//! being queued poisons the consumer: its next submission is not run and fails with the producer's error (a
//! consumer must never read a failed producer's output).
//!
//! Retention: values handed to [`SubmissionBackend::retain_until_complete`] live on the completion and are
//! dropped once the completion is observed complete (a `poll` or `wait` that sees the event done), or when the
//! last handle on the completion goes away — after waiting for the event, so a value never dies before the work
//! that reads it.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use super::gpu::Gpu;
use crate::RunError;
use crate::contract::{Completion, SubmissionBackend};

/// The submission backend of devices of type `G`.
#[derive(Debug)]
pub struct GpuBackend<G>(PhantomData<G>);

/// Work for an executor: a closure that queues device work on the handle it is given.
pub type GpuWork<G> = Box<dyn FnOnce(&G) -> Result<(), RunError> + Send + 'static>;

/// An executor: a device handle with its own queue. See the module docs.
pub struct GpuExecutor<G: Gpu> {
    name: String,
    gpu: G,
    /// The error of a failed producer this executor was ordered after, failing its next submission.
    poisoned: Mutex<Option<RunError>>,
}

impl<G: Gpu> std::fmt::Debug for GpuExecutor<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuExecutor({} on {})", self.name, self.gpu.name())
    }
}

impl<G: Gpu + 'static> GpuExecutor<G> {
    /// An executor named `name` on `gpu`'s queue.
    pub fn new(name: impl Into<String>, gpu: G) -> GpuExecutor<G> {
        GpuExecutor { name: name.into(), gpu, poisoned: Mutex::new(None) }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its device handle (queue work on it directly, then [`GpuExecutor::mark`]).
    pub fn gpu(&self) -> &G {
        &self.gpu
    }

    /// A completion for everything queued on this executor so far — or, if a failed producer poisoned it, that
    /// producer's error (taking the poison: the executor serves again afterwards).
    pub fn mark(&self) -> Result<GpuCompletion<G>, RunError> {
        if let Some(e) = self.poisoned.lock().unwrap_or_else(|e| e.into_inner()).take() {
            return Err(e);
        }
        Ok(GpuCompletion::recorded(self.gpu.clone(), self.gpu.record()?))
    }

    fn take_poison(&self) -> Option<RunError> {
        self.poisoned.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

struct State {
    failed: Option<RunError>,
    done: bool,
    retained: Vec<Box<dyn Any + Send>>,
}

struct Inner<G: Gpu> {
    gpu: G,
    event: Option<G::Event>,
    state: Mutex<State>,
}

impl<G: Gpu> Drop for Inner<G> {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if !state.done
            && let Some(e) = &self.event
        {
            // Retained values must outlive the work; a failing device cannot be waited for, and then they go
            // now (the work is lost with the device).
            let _ = self.gpu.event_wait(e);
        }
    }
}

/// Exactly when an executor's queued work has run (or why it failed to be queued).
pub struct GpuCompletion<G: Gpu>(Arc<Inner<G>>);

impl<G: Gpu> Clone for GpuCompletion<G> {
    fn clone(&self) -> Self {
        GpuCompletion(Arc::clone(&self.0))
    }
}

impl<G: Gpu> std::fmt::Debug for GpuCompletion<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        match (&s.failed, s.done) {
            (Some(e), _) => write!(f, "GpuCompletion(failed: {e})"),
            (None, true) => write!(f, "GpuCompletion(done)"),
            (None, false) => write!(f, "GpuCompletion(queued)"),
        }
    }
}

impl<G: Gpu> GpuCompletion<G> {
    fn recorded(gpu: G, event: G::Event) -> GpuCompletion<G> {
        GpuCompletion(Arc::new(Inner {
            gpu,
            event: Some(event),
            state: Mutex::new(State { failed: None, done: false, retained: Vec::new() }),
        }))
    }

    fn failed(gpu: G, error: RunError) -> GpuCompletion<G> {
        GpuCompletion(Arc::new(Inner {
            gpu,
            event: None,
            state: Mutex::new(State { failed: Some(error), done: true, retained: Vec::new() }),
        }))
    }

    /// Marks the completion done and drops what it retained (outside the lock: a destructor may wait or retain).
    fn finish(&self) {
        let retained = {
            let mut s = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
            s.done = true;
            std::mem::take(&mut s.retained)
        };
        drop(retained);
    }

    fn retain(&self, value: Box<dyn Any + Send>) {
        let mut s = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.done {
            drop(s);
            drop(value);
        } else {
            s.retained.push(value);
        }
    }
}

impl<G: Gpu + 'static> Completion for GpuCompletion<G> {
    type Error = RunError;

    fn wait(&self) -> Result<(), RunError> {
        if let Some(e) = self.0.state.lock().unwrap_or_else(|e| e.into_inner()).failed.clone() {
            return Err(e);
        }
        if let Some(event) = &self.0.event {
            self.0.gpu.event_wait(event)?;
        }
        self.finish();
        Ok(())
    }

    fn poll(&self) -> Option<Result<(), RunError>> {
        {
            let s = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = &s.failed {
                return Some(Err(e.clone()));
            }
            if s.done {
                return Some(Ok(()));
            }
        }
        let event = self.0.event.as_ref()?;
        match self.0.gpu.event_done(event) {
            Ok(true) => {
                self.finish();
                Some(Ok(()))
            }
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

impl<G: Gpu + 'static> SubmissionBackend for GpuBackend<G> {
    type Executor = GpuExecutor<G>;
    type OwnedExecutor = GpuExecutor<G>;
    type Completion = GpuCompletion<G>;
    type Work = GpuWork<G>;

    fn fork_executors(executor: &GpuExecutor<G>, count: usize) -> Result<Vec<GpuExecutor<G>>, RunError> {
        (0..count).map(|i| Ok(GpuExecutor::new(format!("{}.{i}", executor.name), executor.gpu.fork()?))).collect()
    }

    fn submit(executor: &GpuExecutor<G>, work: GpuWork<G>) -> Result<GpuCompletion<G>, RunError> {
        if let Some(e) = executor.take_poison() {
            return Ok(GpuCompletion::failed(executor.gpu.clone(), e));
        }
        match work(&executor.gpu) {
            Ok(()) => Ok(GpuCompletion::recorded(executor.gpu.clone(), executor.gpu.record()?)),
            Err(e) => Ok(GpuCompletion::failed(executor.gpu.clone(), e)),
        }
    }

    fn order_after(completion: &GpuCompletion<G>, executor: &GpuExecutor<G>) -> Result<(), RunError> {
        if let Some(e) = completion.0.state.lock().unwrap_or_else(|e| e.into_inner()).failed.clone() {
            *executor.poisoned.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
            return Ok(());
        }
        match &completion.0.event {
            Some(event) => executor.gpu.wait_for(event),
            None => Ok(()),
        }
    }

    fn retain_until_complete<T: Send + 'static>(
        _executor: &GpuExecutor<G>,
        completion: &GpuCompletion<G>,
        value: T,
    ) -> Result<(), RunError> {
        completion.retain(Box::new(value));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::{HostGpu, NoKernels};

    type Host = HostGpu<NoKernels>;

    fn executor() -> GpuExecutor<Host> {
        GpuExecutor::new("gpu0", HostGpu::new(NoKernels))
    }

    /// Pushes its label to a shared log when dropped.
    struct Noisy(&'static str, Arc<Mutex<Vec<&'static str>>>);

    impl Drop for Noisy {
        fn drop(&mut self) {
            self.1.lock().unwrap().push(self.0);
        }
    }

    #[test]
    fn work_queues_on_the_executor_and_completes_with_its_event() {
        let e = executor();
        let forked = GpuBackend::fork_executors(&e, 2).unwrap();
        assert_eq!(forked[1].name(), "gpu0.1");
        let slot = e.gpu().alloc(4).unwrap();
        let c = GpuBackend::submit(
            &forked[0],
            Box::new(move |gpu: &Host| {
                // SAFETY: `slot` holds 4 bytes.
                unsafe { gpu.upload(slot, &7u32.to_le_bytes()) }
            }),
        )
        .unwrap();
        c.wait().unwrap();
        assert_eq!(c.poll().map(|r| r.is_ok()), Some(true));
        let mut back = [0u8; 4];
        // SAFETY: as above.
        unsafe { e.gpu().download(slot, &mut back).unwrap() };
        assert_eq!(u32::from_le_bytes(back), 7);
        // SAFETY: allocated above, no work pending.
        unsafe { e.gpu().free(slot) };
        assert_eq!(e.gpu().allocated_bytes(), 0);
    }

    #[test]
    fn a_failed_producer_poisons_the_consumers_next_submission_once() {
        let (producer, consumer) = (executor(), executor());
        let failed = GpuBackend::submit(&producer, Box::new(|_: &Host| Err(RunError::Op("boom".into())))).unwrap();
        assert!(matches!(failed.wait(), Err(RunError::Op(m)) if m == "boom"));
        GpuBackend::order_after(&failed, &consumer).unwrap();
        let ran = Arc::new(Mutex::new(false));
        let r = Arc::clone(&ran);
        let c = GpuBackend::submit(
            &consumer,
            Box::new(move |_: &Host| {
                *r.lock().unwrap() = true;
                Ok(())
            }),
        )
        .unwrap();
        assert!(matches!(c.wait(), Err(RunError::Op(m)) if m == "boom"));
        assert!(!*ran.lock().unwrap(), "the consumer's work must not run after a failed producer");
        // The poison is taken: the next submission runs.
        let ok = GpuBackend::submit(&consumer, Box::new(|_: &Host| Ok(()))).unwrap();
        ok.wait().unwrap();
        assert!(consumer.mark().is_ok());
    }

    #[test]
    fn retained_values_live_until_the_completion_is_observed() {
        let e = executor();
        let log = Arc::new(Mutex::new(Vec::new()));
        let c = GpuBackend::submit(&e, Box::new(|_: &Host| Ok(()))).unwrap();
        GpuBackend::retain_until_complete(&e, &c, Noisy("a", Arc::clone(&log))).unwrap();
        GpuBackend::retain_until_complete(&e, &c, Noisy("b", Arc::clone(&log))).unwrap();
        assert!(log.lock().unwrap().is_empty());
        c.wait().unwrap();
        assert_eq!(*log.lock().unwrap(), ["a", "b"]);
        // Retaining on a complete completion drops at once.
        GpuBackend::retain_until_complete(&e, &c, Noisy("c", Arc::clone(&log))).unwrap();
        assert_eq!(*log.lock().unwrap(), ["a", "b", "c"]);
        // A completion dropped unobserved still drops what it kept.
        let c2 = GpuBackend::submit(&e, Box::new(|_: &Host| Ok(()))).unwrap();
        GpuBackend::retain_until_complete(&e, &c2, Noisy("d", Arc::clone(&log))).unwrap();
        drop(c2);
        assert_eq!(log.lock().unwrap().last(), Some(&"d"));
    }
}
