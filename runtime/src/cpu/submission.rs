//! Submission on the CPU: executors are worker threads with in-order queues, completions are exact.
//!
//! Each [`CpuExecutor`] is one lane: a dedicated OS thread that runs submitted jobs one after another, in
//! submission order (like a CUDA stream). Lanes forked from one executor share the device — the jobs they run use
//! the same kernels and the same rayon pool of the program they call — but are scheduled independently, so two
//! requests on two lanes run concurrently. A [`CpuCompletion`] becomes ready exactly when its job has returned
//! (or panicked: a panic is caught on the lane and reported as an error; the lane keeps serving).
//!
//! Ordering across lanes: [`SubmissionBackend::order_after`] enqueues a barrier on the consumer lane; the lane
//! blocks at the barrier until the producer's completion is ready. If the producer failed, the consumer's next job
//! is not run and fails with the producer's error (a consumer must never read a failed producer's output).
//!
//! Retention: values handed to [`SubmissionBackend::retain_until_complete`] are stored on the completion and
//! dropped on the lane right after the job finishes, before waiters are woken — so a waiter observes them
//! dropped, in retention order.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

use crate::RunError;
use crate::contract::{Completion, SubmissionBackend};

/// The CPU backend as a type: implements the capability traits (submission here; parameters, transfer and
/// collectives beside it).
#[derive(Copy, Clone, Debug, Default)]
pub struct CpuBackend;

/// A job for a CPU lane.
pub type CpuWork = Box<dyn FnOnce() -> Result<(), RunError> + Send + 'static>;

#[derive(Default)]
enum Status {
    #[default]
    Pending,
    Done,
    Failed(RunError),
}

#[derive(Default)]
struct Slot {
    status: Status,
    retained: Vec<Box<dyn Any + Send>>,
}

struct CompletionInner {
    slot: Mutex<Slot>,
    ready: Condvar,
}

/// The exact completion of one CPU submission. Clones wait on the same work.
#[derive(Clone)]
pub struct CpuCompletion(Arc<CompletionInner>);

impl CpuCompletion {
    fn pending() -> CpuCompletion {
        CpuCompletion(Arc::new(CompletionInner { slot: Mutex::new(Slot::default()), ready: Condvar::new() }))
    }

    /// A completion that is already complete with `outcome` (for work done synchronously).
    pub fn ready(outcome: Result<(), RunError>) -> CpuCompletion {
        let c = CpuCompletion::pending();
        c.finish(outcome);
        c
    }

    /// Records the outcome, drops the retained values (in retention order), then wakes waiters.
    fn finish(&self, outcome: Result<(), RunError>) {
        let retained = {
            let mut slot = self.0.slot.lock().unwrap_or_else(|e| e.into_inner());
            slot.status = match outcome {
                Ok(()) => Status::Done,
                Err(e) => Status::Failed(e),
            };
            std::mem::take(&mut slot.retained)
        };
        // Dropped outside the lock: a retained value's destructor may itself wait or retain.
        for value in retained {
            drop(value);
        }
        self.0.ready.notify_all();
    }

    fn outcome(slot: &Slot) -> Option<Result<(), RunError>> {
        match &slot.status {
            Status::Pending => None,
            Status::Done => Some(Ok(())),
            Status::Failed(e) => Some(Err(e.clone())),
        }
    }

    /// Keeps `value` until this completion is ready, or drops it now if it already is.
    fn retain(&self, value: Box<dyn Any + Send>) {
        let mut slot = self.0.slot.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(slot.status, Status::Pending) {
            slot.retained.push(value);
        } else {
            drop(slot);
            drop(value);
        }
    }
}

impl std::fmt::Debug for CpuCompletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.poll() {
            None => "pending".to_string(),
            Some(Ok(())) => "done".to_string(),
            Some(Err(e)) => format!("failed: {e}"),
        };
        write!(f, "CpuCompletion({state})")
    }
}

impl Completion for CpuCompletion {
    type Error = RunError;

    fn wait(&self) -> Result<(), RunError> {
        let mut slot = self.0.slot.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(outcome) = CpuCompletion::outcome(&slot) {
                return outcome;
            }
            slot = self.0.ready.wait(slot).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn poll(&self) -> Option<Result<(), RunError>> {
        CpuCompletion::outcome(&self.0.slot.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

enum Message {
    Run(CpuWork, CpuCompletion),
    After(CpuCompletion),
}

struct Lane {
    name: String,
    queue: Mutex<mpsc::Sender<Message>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Lane {
    fn drop(&mut self) {
        // Closing the queue ends the thread after it has run everything already submitted.
        let (closed, _) = mpsc::channel();
        *self.queue.get_mut().unwrap_or_else(|e| e.into_inner()) = closed;
        if let Some(thread) = self.thread.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            // A lane dropped from its own thread (a job holding the last handle) must not join itself.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// One in-order lane of CPU work. Cheap to clone (clones share the lane); the lane's thread ends when the last
/// handle is dropped, after finishing the work already submitted.
#[derive(Clone)]
pub struct CpuExecutor(Arc<Lane>);

impl std::fmt::Debug for CpuExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuExecutor({})", self.0.name)
    }
}

impl CpuExecutor {
    /// Starts a new lane; `name` names its thread (`kiln-lane-NAME`).
    pub fn new(name: impl Into<String>) -> Result<CpuExecutor, RunError> {
        let name = name.into();
        let (tx, rx) = mpsc::channel::<Message>();
        let thread = std::thread::Builder::new()
            .name(format!("kiln-lane-{name}"))
            .spawn(move || lane_loop(rx))
            .map_err(|e| RunError::Submission(format!("cannot start executor thread `{name}`: {e}")))?;
        Ok(CpuExecutor(Arc::new(Lane { name, queue: Mutex::new(tx), thread: Mutex::new(Some(thread)) })))
    }

    /// The lane's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    fn send(&self, message: Message) -> Result<(), RunError> {
        self.0
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(message)
            .map_err(|_| RunError::Submission(format!("executor `{}` has stopped", self.0.name)))
    }

    /// Submits a job; shorthand for [`SubmissionBackend::submit`] on [`CpuBackend`].
    pub fn submit(
        &self,
        work: impl FnOnce() -> Result<(), RunError> + Send + 'static,
    ) -> Result<CpuCompletion, RunError> {
        CpuBackend::submit(self, Box::new(work))
    }

    /// Submits a job that produces a value; the returned [`Pending`] yields it once the job has completed.
    pub fn submit_with_result<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, RunError> + Send + 'static,
    ) -> Result<Pending<T>, RunError> {
        let slot = Arc::new(Mutex::new(None));
        let out = Arc::clone(&slot);
        let completion = self.submit(move || {
            let value = work()?;
            *out.lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
            Ok(())
        })?;
        Ok(Pending { completion, value: slot })
    }
}

/// A value being computed by submitted work: its completion, and the value once it is ready.
pub struct Pending<T> {
    completion: CpuCompletion,
    value: Arc<Mutex<Option<T>>>,
}

impl<T> Pending<T> {
    /// The work's completion (to order other lanes after it, or to poll).
    pub fn completion(&self) -> &CpuCompletion {
        &self.completion
    }

    /// Waits for the work and takes its value.
    pub fn wait(self) -> Result<T, RunError> {
        self.completion.wait()?;
        self.value
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| RunError::Submission("completed work left no value".into()))
    }
}

fn lane_loop(rx: mpsc::Receiver<Message>) {
    // The failure of a producer this lane was ordered after, owed to the next job.
    let mut owed: Option<RunError> = None;
    while let Ok(message) = rx.recv() {
        match message {
            Message::After(producer) => {
                if let Err(e) = producer.wait() {
                    owed = Some(e);
                }
            }
            Message::Run(work, completion) => {
                let outcome = match owed.take() {
                    Some(e) => Err(RunError::Submission(format!("not run: ordered after failed work ({e})"))),
                    None => match std::panic::catch_unwind(AssertUnwindSafe(work)) {
                        Ok(outcome) => outcome,
                        Err(payload) => {
                            Err(RunError::Submission(format!("work panicked: {}", panic_message(&payload))))
                        }
                    },
                };
                completion.finish(outcome);
            }
        }
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(payload: &Box<dyn Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}

impl SubmissionBackend for CpuBackend {
    type Executor = CpuExecutor;
    type OwnedExecutor = CpuExecutor;
    type Completion = CpuCompletion;
    type Work = CpuWork;

    fn fork_executors(executor: &CpuExecutor, count: usize) -> Result<Vec<CpuExecutor>, RunError> {
        (0..count).map(|i| CpuExecutor::new(format!("{}.{i}", executor.name()))).collect()
    }

    fn submit(executor: &CpuExecutor, work: CpuWork) -> Result<CpuCompletion, RunError> {
        let completion = CpuCompletion::pending();
        executor.send(Message::Run(work, completion.clone()))?;
        Ok(completion)
    }

    fn order_after(completion: &CpuCompletion, executor: &CpuExecutor) -> Result<(), RunError> {
        executor.send(Message::After(completion.clone()))
    }

    fn retain_until_complete<T: Send + 'static>(
        _executor: &CpuExecutor,
        completion: &CpuCompletion,
        value: T,
    ) -> Result<(), RunError> {
        completion.retain(Box::new(value));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::channel;
    use std::time::Duration;

    use super::*;

    const LONG: Duration = Duration::from_secs(10);

    fn lane(name: &str) -> CpuExecutor {
        CpuExecutor::new(name).unwrap()
    }

    /// Pushes its label to a shared log when dropped.
    struct Noisy(&'static str, Arc<Mutex<Vec<&'static str>>>);

    impl Drop for Noisy {
        fn drop(&mut self) {
            self.1.lock().unwrap().push(self.0);
        }
    }

    #[test]
    fn one_lane_runs_in_submission_order() {
        let e = lane("order");
        let log = Arc::new(Mutex::new(Vec::new()));
        let completions: Vec<_> = (0..20)
            .map(|i| {
                let log = Arc::clone(&log);
                e.submit(move || {
                    log.lock().unwrap().push(i);
                    Ok(())
                })
                .unwrap()
            })
            .collect();
        completions.last().unwrap().wait().unwrap();
        assert!(completions.iter().all(|c| c.is_complete()), "earlier work completes before later work");
        assert_eq!(*log.lock().unwrap(), (0..20).collect::<Vec<_>>());
    }

    #[test]
    fn forked_lanes_run_concurrently() {
        let e = lane("root");
        let lanes = CpuBackend::fork_executors(&e, 2).unwrap();
        assert_eq!(lanes.len(), 2);
        // Each job waits for the other's signal: both finish only if they run at the same time.
        let (to_a, from_b) = channel::<()>();
        let (to_b, from_a) = channel::<()>();
        let a = lanes[0]
            .submit(move || {
                to_b.send(()).unwrap();
                from_b.recv_timeout(LONG).map_err(|_| RunError::Submission("lane b never ran".into()))
            })
            .unwrap();
        let b = lanes[1]
            .submit(move || {
                to_a.send(()).unwrap();
                from_a.recv_timeout(LONG).map_err(|_| RunError::Submission("lane a never ran".into()))
            })
            .unwrap();
        a.wait().unwrap();
        b.wait().unwrap();
    }

    #[test]
    fn poll_is_none_until_the_work_finishes() {
        let e = lane("poll");
        let (release, gate) = channel::<()>();
        let c = e.submit(move || gate.recv_timeout(LONG).map_err(|_| RunError::Submission("gate".into()))).unwrap();
        assert!(c.poll().is_none());
        release.send(()).unwrap();
        assert_eq!(c.wait(), Ok(()));
        assert_eq!(c.poll(), Some(Ok(())));
    }

    #[test]
    fn order_after_makes_a_lane_wait_for_another_lanes_work() {
        let producer = lane("producer");
        let consumer = lane("consumer");
        let cell = Arc::new(Mutex::new(0));
        let (release, gate) = channel::<()>();
        let written = {
            let cell = Arc::clone(&cell);
            producer
                .submit(move || {
                    gate.recv_timeout(LONG).map_err(|_| RunError::Submission("gate".into()))?;
                    *cell.lock().unwrap() = 42;
                    Ok(())
                })
                .unwrap()
        };
        CpuBackend::order_after(&written, &consumer).unwrap();
        let read = {
            let cell = Arc::clone(&cell);
            consumer.submit_with_result(move || Ok(*cell.lock().unwrap())).unwrap()
        };
        // The consumer is blocked at the barrier while the producer waits at its gate.
        std::thread::sleep(Duration::from_millis(20));
        assert!(read.completion().poll().is_none());
        release.send(()).unwrap();
        assert_eq!(read.wait().unwrap(), 42);
    }

    #[test]
    fn work_ordered_after_a_failure_does_not_run() {
        let producer = lane("failing");
        let consumer = lane("after-failure");
        let failed = producer.submit(|| Err(RunError::Op("boom".into()))).unwrap();
        CpuBackend::order_after(&failed, &consumer).unwrap();
        let ran = Arc::new(Mutex::new(false));
        let skipped = {
            let ran = Arc::clone(&ran);
            consumer
                .submit(move || {
                    *ran.lock().unwrap() = true;
                    Ok(())
                })
                .unwrap()
        };
        let err = skipped.wait().unwrap_err().to_string();
        assert!(err.contains("ordered after failed work") && err.contains("boom"), "{err}");
        assert!(!*ran.lock().unwrap());
        // Only the next job pays for the failure; the lane goes on serving.
        assert_eq!(consumer.submit(|| Ok(())).unwrap().wait(), Ok(()));
    }

    #[test]
    fn retained_values_drop_exactly_at_their_completion_in_order() {
        let e = lane("retain");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (release_first, gate_first) = channel::<()>();
        let (release_second, gate_second) = channel::<()>();
        let first =
            e.submit(move || gate_first.recv_timeout(LONG).map_err(|_| RunError::Submission("g1".into()))).unwrap();
        let second =
            e.submit(move || gate_second.recv_timeout(LONG).map_err(|_| RunError::Submission("g2".into()))).unwrap();
        CpuBackend::retain_until_complete(&e, &second, Noisy("second.a", Arc::clone(&log))).unwrap();
        CpuBackend::retain_until_complete(&e, &first, Noisy("first.a", Arc::clone(&log))).unwrap();
        CpuBackend::retain_until_complete(&e, &first, Noisy("first.b", Arc::clone(&log))).unwrap();
        CpuBackend::retain_until_complete(&e, &second, Noisy("second.b", Arc::clone(&log))).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(log.lock().unwrap().is_empty(), "nothing drops before its completion");
        release_first.send(()).unwrap();
        first.wait().unwrap();
        assert_eq!(*log.lock().unwrap(), ["first.a", "first.b"]);
        release_second.send(()).unwrap();
        second.wait().unwrap();
        assert_eq!(*log.lock().unwrap(), ["first.a", "first.b", "second.a", "second.b"]);
        // Retaining on a finished completion drops at once.
        CpuBackend::retain_until_complete(&e, &first, Noisy("late", Arc::clone(&log))).unwrap();
        assert_eq!(log.lock().unwrap().last(), Some(&"late"));
    }

    #[test]
    fn a_panicking_job_fails_its_completion_and_the_lane_survives() {
        let e = lane("panics");
        let c = e.submit(|| panic!("kernel exploded")).unwrap();
        let err = c.wait().unwrap_err().to_string();
        assert!(err.contains("panicked") && err.contains("kernel exploded"), "{err}");
        assert_eq!(e.submit_with_result(|| Ok(7)).unwrap().wait().unwrap(), 7);
    }

    #[test]
    fn dropping_the_last_handle_finishes_submitted_work() {
        let e = lane("drop");
        let done = Arc::new(Mutex::new(0));
        let c = {
            let done = Arc::clone(&done);
            e.submit(move || {
                std::thread::sleep(Duration::from_millis(10));
                *done.lock().unwrap() += 1;
                Ok(())
            })
            .unwrap()
        };
        drop(e);
        assert_eq!(c.poll(), Some(Ok(())), "the lane drains its queue before it stops");
        assert_eq!(*done.lock().unwrap(), 1);
    }
}
