//! Collectives on the CPU: the reference semantics of [`crate::contract::collective`] as plain functions, and
//! [`LocalGroup`], a group of ranks that are threads of one process.
//!
//! A local group meets at a rendezvous: each rank deposits its tensor; the last to arrive computes every rank's
//! result (sums in rank order, so every rank gets identical bits) and wakes the others; each takes its result, and
//! the next round opens once all have. A rank that waits longer than the group's timeout breaks the group: it and
//! every later call get an error naming the ranks that never arrived, instead of hanging forever.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use half::{bf16, f16};
use kiln_ir::tensor::Data;
use kiln_ir::{DType, Tensor};

use crate::RunError;
use crate::contract::{CollectiveBackend, CollectiveGroup, ReduceOp};
use crate::cpu::{CpuBackend, CpuExecutor};

/// Which collective a rank called (ranks of one round must agree). Named as the collectives are.
#[allow(clippy::enum_variant_names)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Collective {
    AllReduce(ReduceOp),
    AllGather,
    AllToAll,
}

impl std::fmt::Display for Collective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Collective::AllReduce(op) => write!(f, "all_reduce({op})"),
            Collective::AllGather => f.write_str("all_gather"),
            Collective::AllToAll => f.write_str("all_to_all"),
        }
    }
}

fn describe(t: &Tensor) -> String {
    format!("{}{:?}", t.dtype(), t.shape())
}

/// Checks that every rank's tensor has the same dtype and shape.
fn check_agree(what: Collective, parts: &[&Tensor]) -> Result<(), RunError> {
    let first = parts.first().ok_or_else(|| RunError::Collective(format!("{what} over an empty group")))?;
    for (rank, t) in parts.iter().enumerate() {
        if t.dtype() != first.dtype() || t.shape() != first.shape() {
            return Err(RunError::Collective(format!(
                "{what}: rank {rank} has {} but rank 0 has {}",
                describe(t),
                describe(first)
            )));
        }
    }
    Ok(())
}

fn fold<T: Copy>(parts: &[&[T]], f: impl Fn(T, T) -> T) -> Vec<T> {
    let mut acc = parts[0].to_vec();
    for part in &parts[1..] {
        for (a, &b) in acc.iter_mut().zip(part.iter()) {
            *a = f(*a, b);
        }
    }
    acc
}

fn float_max<T: PartialOrd + Copy>(a: T, b: T) -> T {
    // NaN is the only value not equal to itself; it wins from either side.
    #[allow(clippy::eq_op)]
    let (a_nan, b_nan) = (a != a, b != b);
    if a_nan {
        a
    } else if b_nan || b > a {
        b
    } else {
        a
    }
}

fn slices<'a, T: kiln_ir::tensor::Element>(parts: &[&'a Tensor]) -> Vec<&'a [T]> {
    parts.iter().map(|t| t.as_slice::<T>().expect("dtypes checked to agree")).collect()
}

/// Elementwise `op` over the ranks' tensors, in rank order.
pub fn reduce(parts: &[&Tensor], op: ReduceOp) -> Result<Tensor, RunError> {
    let what = Collective::AllReduce(op);
    check_agree(what, parts)?;
    let shape = parts[0].shape().to_vec();
    let data = match (parts[0].dtype(), op) {
        (DType::F32, ReduceOp::Sum) => Data::F32(fold(&slices::<f32>(parts), |a, b| a + b)),
        (DType::F32, ReduceOp::Max) => Data::F32(fold(&slices::<f32>(parts), float_max)),
        (DType::F64, ReduceOp::Sum) => Data::F64(fold(&slices::<f64>(parts), |a, b| a + b)),
        (DType::F64, ReduceOp::Max) => Data::F64(fold(&slices::<f64>(parts), float_max)),
        (DType::I32, ReduceOp::Sum) => Data::I32(fold(&slices::<i32>(parts), i32::wrapping_add)),
        (DType::I32, ReduceOp::Max) => Data::I32(fold(&slices::<i32>(parts), i32::max)),
        (DType::I64, ReduceOp::Sum) => Data::I64(fold(&slices::<i64>(parts), i64::wrapping_add)),
        (DType::I64, ReduceOp::Max) => Data::I64(fold(&slices::<i64>(parts), i64::max)),
        (DType::I8, ReduceOp::Sum) => Data::I8(fold(&slices::<i8>(parts), i8::wrapping_add)),
        (DType::I8, ReduceOp::Max) => Data::I8(fold(&slices::<i8>(parts), i8::max)),
        (DType::U8, ReduceOp::Sum) => Data::U8(fold(&slices::<u8>(parts), u8::wrapping_add)),
        (DType::U8, ReduceOp::Max) => Data::U8(fold(&slices::<u8>(parts), u8::max)),
        (DType::I16, ReduceOp::Sum) => Data::I16(fold(&slices::<i16>(parts), i16::wrapping_add)),
        (DType::I16, ReduceOp::Max) => Data::I16(fold(&slices::<i16>(parts), i16::max)),
        (DType::U16, ReduceOp::Sum) => Data::U16(fold(&slices::<u16>(parts), u16::wrapping_add)),
        (DType::U16, ReduceOp::Max) => Data::U16(fold(&slices::<u16>(parts), u16::max)),
        (DType::U32, ReduceOp::Sum) => Data::U32(fold(&slices::<u32>(parts), u32::wrapping_add)),
        (DType::U32, ReduceOp::Max) => Data::U32(fold(&slices::<u32>(parts), u32::max)),
        (DType::U64, ReduceOp::Sum) => Data::U64(fold(&slices::<u64>(parts), u64::wrapping_add)),
        (DType::U64, ReduceOp::Max) => Data::U64(fold(&slices::<u64>(parts), u64::max)),
        // Half precision accumulates in f32 and rounds once, so the result does not depend on the group size's
        // intermediate roundings.
        (DType::F16, _) => {
            let wide: Vec<Vec<f32>> =
                slices::<f16>(parts).iter().map(|s| s.iter().map(|v| v.to_f32()).collect()).collect();
            let acc = reduce_f32(&wide, op);
            Data::F16(acc.into_iter().map(f16::from_f32).collect())
        }
        (DType::BF16, _) => {
            let wide: Vec<Vec<f32>> =
                slices::<bf16>(parts).iter().map(|s| s.iter().map(|v| v.to_f32()).collect()).collect();
            let acc = reduce_f32(&wide, op);
            Data::BF16(acc.into_iter().map(bf16::from_f32).collect())
        }
        (DType::Bool, _) => {
            return Err(RunError::Collective(format!("{what}: dtype bool is not supported (cast to u8 first)")));
        }
        (d @ kiln_ir::narrow_dtypes!(), _) => {
            return Err(RunError::Collective(format!(
                "{what}: dtype {d} is not supported (cast to a wider type first)"
            )));
        }
    };
    Tensor::new(shape, data).map_err(|e| RunError::Collective(format!("{what}: {e}")))
}

fn reduce_f32(parts: &[Vec<f32>], op: ReduceOp) -> Vec<f32> {
    let views: Vec<&[f32]> = parts.iter().map(|v| v.as_slice()).collect();
    match op {
        ReduceOp::Sum => fold(&views, |a, b| a + b),
        ReduceOp::Max => fold(&views, float_max),
    }
}

/// Rows (axis-0 entries) and bytes per row of `t`; a scalar is one row.
fn rows(t: &Tensor) -> (usize, usize) {
    let n = t.shape().first().copied().unwrap_or(1);
    let bytes = t.as_bytes().len();
    (n, bytes.checked_div(n).unwrap_or(0))
}

/// The ranks' tensors concatenated along axis 0 in rank order.
pub fn gather(parts: &[&Tensor]) -> Result<Tensor, RunError> {
    check_agree(Collective::AllGather, parts)?;
    let mut shape = parts[0].shape().to_vec();
    if shape.is_empty() {
        shape.push(parts.len());
    } else {
        shape[0] *= parts.len();
    }
    let mut bytes = Vec::with_capacity(parts.iter().map(|t| t.as_bytes().len()).sum());
    for t in parts {
        bytes.extend_from_slice(t.as_bytes());
    }
    from_bytes(Collective::AllGather, parts[0].dtype(), shape, &bytes)
}

fn from_bytes(what: Collective, dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Result<Tensor, RunError> {
    Tensor::from_bytes(dtype, shape, bytes)
        .ok_or_else(|| RunError::Collective(format!("{what}: result bytes do not fit the result shape")))
}

/// Checks that `t`'s axis 0 splits into `size` equal chunks; the chunk's rows.
pub(crate) fn chunk_rows(t: &Tensor, size: usize) -> Result<usize, RunError> {
    let what = Collective::AllToAll;
    match t.shape().first() {
        None => Err(RunError::Collective(format!("{what}: a scalar cannot be split among {size} ranks"))),
        Some(&n) if n % size != 0 => Err(RunError::Collective(format!(
            "{what}: axis 0 of {} does not split into {size} equal chunks",
            describe(t)
        ))),
        Some(&n) => Ok(n / size),
    }
}

/// Rank `rank`'s result of an all-to-all: chunk `rank` of every rank's tensor, in sender order.
pub fn exchange(parts: &[&Tensor], rank: usize) -> Result<Tensor, RunError> {
    check_agree(Collective::AllToAll, parts)?;
    let per = chunk_rows(parts[0], parts.len())?;
    let (_, row_bytes) = rows(parts[0]);
    let chunk = per * row_bytes;
    let mut bytes = Vec::with_capacity(chunk * parts.len());
    for t in parts {
        bytes.extend_from_slice(&t.as_bytes()[rank * chunk..(rank + 1) * chunk]);
    }
    from_bytes(Collective::AllToAll, parts[0].dtype(), parts[0].shape().to_vec(), &bytes)
}

/// How long a rank of a [`LocalGroup`] waits for the others by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Default)]
struct Round {
    generation: u64,
    calls: Vec<Option<(Collective, Tensor)>>,
    arrived: usize,
    results: Vec<Option<Result<Tensor, RunError>>>,
    taken: usize,
    broken: Option<String>,
}

struct Rendezvous {
    size: usize,
    timeout: Duration,
    round: Mutex<Round>,
    changed: Condvar,
}

/// One rank's handle to a group of threads in this process. Create all ranks at once with [`LocalGroup::new`]
/// and give each to its own thread (or executor).
#[derive(Clone)]
pub struct LocalGroup {
    rank: usize,
    shared: Arc<Rendezvous>,
}

impl std::fmt::Debug for LocalGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalGroup(rank {} of {})", self.rank, self.shared.size)
    }
}

impl LocalGroup {
    /// The `size` ranks of a new group, in rank order.
    pub fn new(size: usize) -> Result<Vec<LocalGroup>, RunError> {
        LocalGroup::with_timeout(size, DEFAULT_TIMEOUT)
    }

    /// As [`LocalGroup::new`], with how long a rank waits for the others before the group breaks.
    pub fn with_timeout(size: usize, timeout: Duration) -> Result<Vec<LocalGroup>, RunError> {
        if size == 0 {
            return Err(RunError::Collective("a group needs at least one rank".into()));
        }
        let round = Round {
            calls: (0..size).map(|_| None).collect(),
            results: (0..size).map(|_| None).collect(),
            ..Round::default()
        };
        let shared = Arc::new(Rendezvous { size, timeout, round: Mutex::new(round), changed: Condvar::new() });
        Ok((0..size).map(|rank| LocalGroup { rank, shared: Arc::clone(&shared) }).collect())
    }

    /// Runs one collective: deposits `value`, waits for every rank, returns this rank's result.
    pub(crate) fn meet(&self, what: Collective, value: Tensor) -> Result<Tensor, RunError> {
        let shared = &self.shared;
        let deadline = Instant::now() + shared.timeout;
        let mut round = shared.round.lock().unwrap_or_else(|e| e.into_inner());
        // Wait for the previous round's results to be collected.
        while round.broken.is_none() && round.arrived == shared.size {
            round = self.wait(round, deadline, what)?;
        }
        if let Some(why) = &round.broken {
            return Err(RunError::Collective(format!("{what} on rank {}: the group is broken: {why}", self.rank)));
        }
        if round.calls[self.rank].is_some() {
            return Err(RunError::Collective(format!("{what}: rank {} entered a round twice", self.rank)));
        }
        let generation = round.generation;
        round.calls[self.rank] = Some((what, value));
        round.arrived += 1;
        if round.arrived == shared.size {
            let calls: Vec<(Collective, Tensor)> =
                round.calls.iter_mut().map(|c| c.take().expect("all arrived")).collect();
            round.results = compute_round(&calls).into_iter().map(Some).collect();
            shared.changed.notify_all();
        }
        while round.broken.is_none() && !(round.generation == generation && round.arrived == shared.size) {
            round = self.wait(round, deadline, what)?;
        }
        if let Some(why) = &round.broken {
            return Err(RunError::Collective(format!("{what} on rank {}: the group is broken: {why}", self.rank)));
        }
        let result = round.results[self.rank].take().expect("each rank takes its result once");
        round.taken += 1;
        if round.taken == shared.size {
            round.generation += 1;
            round.arrived = 0;
            round.taken = 0;
            shared.changed.notify_all();
        }
        result
    }

    fn wait<'a>(
        &self,
        round: std::sync::MutexGuard<'a, Round>,
        deadline: Instant,
        what: Collective,
    ) -> Result<std::sync::MutexGuard<'a, Round>, RunError> {
        let now = Instant::now();
        if now >= deadline {
            let mut round = round;
            let missing: Vec<String> =
                round.calls.iter().enumerate().filter(|(_, c)| c.is_none()).map(|(r, _)| r.to_string()).collect();
            let why = format!(
                "rank {} waited {:?} in {what}; ranks without a call: [{}]",
                self.rank,
                self.shared.timeout,
                missing.join(", ")
            );
            round.broken = Some(why.clone());
            self.shared.changed.notify_all();
            return Err(RunError::Collective(why));
        }
        let (round, _) = self.shared.changed.wait_timeout(round, deadline - now).unwrap_or_else(|e| e.into_inner());
        Ok(round)
    }
}

/// Every rank's result of one round; all errors when the ranks disagree on the collective.
fn compute_round(calls: &[(Collective, Tensor)]) -> Vec<Result<Tensor, RunError>> {
    let what = calls[0].0;
    if let Some((rank, (other, _))) = calls.iter().enumerate().find(|(_, (w, _))| *w != what) {
        let e = RunError::Collective(format!(
            "ranks disagree on the collective: rank 0 called {what}, rank {rank} {other}"
        ));
        return calls.iter().map(|_| Err(e.clone())).collect();
    }
    let parts: Vec<&Tensor> = calls.iter().map(|(_, t)| t).collect();
    match what {
        Collective::AllReduce(op) => {
            let r = reduce(&parts, op);
            calls.iter().map(|_| r.clone()).collect()
        }
        Collective::AllGather => {
            let r = gather(&parts);
            calls.iter().map(|_| r.clone()).collect()
        }
        Collective::AllToAll => (0..calls.len()).map(|rank| exchange(&parts, rank)).collect(),
    }
}

impl CollectiveGroup for LocalGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }
}

/// Runs a collective on `executor`'s lane (after its earlier work) and waits for it.
fn on_lane(executor: &CpuExecutor, group: &LocalGroup, what: Collective, value: Tensor) -> Result<Tensor, RunError> {
    let group = group.clone();
    executor.submit_with_result(move || group.meet(what, value))?.wait()
}

impl CollectiveBackend for CpuBackend {
    type Tensor = Tensor;
    type Group = LocalGroup;
    type CollectiveError = RunError;

    fn all_reduce(value: Tensor, op: ReduceOp, group: &LocalGroup, executor: &CpuExecutor) -> Result<Tensor, RunError> {
        on_lane(executor, group, Collective::AllReduce(op), value)
    }

    fn all_gather(value: Tensor, group: &LocalGroup, executor: &CpuExecutor) -> Result<Tensor, RunError> {
        on_lane(executor, group, Collective::AllGather, value)
    }

    fn all_to_all(value: Tensor, group: &LocalGroup, executor: &CpuExecutor) -> Result<Tensor, RunError> {
        on_lane(executor, group, Collective::AllToAll, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `body(rank, group, executor)` on every rank of a new group of `size`, each on its own thread.
    fn on_ranks<T: Send + 'static>(
        size: usize,
        timeout: Duration,
        body: impl Fn(usize, LocalGroup, CpuExecutor) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let body = Arc::new(body);
        let groups = LocalGroup::with_timeout(size, timeout).unwrap();
        let threads: Vec<_> = groups
            .into_iter()
            .enumerate()
            .map(|(rank, group)| {
                let body = Arc::clone(&body);
                std::thread::spawn(move || body(rank, group, CpuExecutor::new(format!("rank{rank}")).unwrap()))
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("rank thread")).collect()
    }

    fn ints(rank: usize, n: usize) -> Vec<i64> {
        (0..n).map(|i| (i as i64 * 7 - rank as i64 * 13) % 11).collect()
    }

    fn floats(rank: usize, n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 31 + rank * 17) % 23) as f32 * 0.37 - 4.0).collect()
    }

    #[test]
    fn all_reduce_matches_plain_arithmetic() {
        let size = 4;
        let results = on_ranks(size, DEFAULT_TIMEOUT, move |rank, g, e| {
            let i = Tensor::from_vec(vec![3, 4], ints(rank, 12)).unwrap();
            let f = Tensor::from_vec(vec![12], floats(rank, 12)).unwrap();
            (
                CpuBackend::all_reduce(i.clone(), ReduceOp::Sum, &g, &e).unwrap(),
                CpuBackend::all_reduce(i, ReduceOp::Max, &g, &e).unwrap(),
                CpuBackend::all_reduce(f.clone(), ReduceOp::Sum, &g, &e).unwrap(),
                CpuBackend::all_reduce(f, ReduceOp::Max, &g, &e).unwrap(),
            )
        });
        let want_isum: Vec<i64> = (0..12).map(|k| (0..size).map(|r| ints(r, 12)[k]).sum()).collect();
        let want_imax: Vec<i64> = (0..12).map(|k| (0..size).map(|r| ints(r, 12)[k]).max().unwrap()).collect();
        let want_fsum: Vec<f64> = (0..12).map(|k| (0..size).map(|r| floats(r, 12)[k] as f64).sum()).collect();
        let want_fmax: Vec<f32> =
            (0..12).map(|k| (0..size).map(|r| floats(r, 12)[k]).fold(f32::MIN, f32::max)).collect();
        for (isum, imax, fsum, fmax) in &results {
            assert_eq!(isum.shape(), [3, 4]);
            assert_eq!(isum.as_slice::<i64>().unwrap(), want_isum.as_slice());
            assert_eq!(imax.as_slice::<i64>().unwrap(), want_imax.as_slice());
            for (got, want) in fsum.as_slice::<f32>().unwrap().iter().zip(&want_fsum) {
                assert!((*got as f64 - want).abs() <= 1e-6 * want.abs().max(1.0), "{got} vs {want}");
            }
            assert_eq!(fmax.as_slice::<f32>().unwrap(), want_fmax.as_slice());
            // Every rank gets identical bits.
            assert_eq!(fsum.as_bytes(), results[0].2.as_bytes());
        }
    }

    #[test]
    fn all_gather_concatenates_in_rank_order() {
        let results = on_ranks(3, DEFAULT_TIMEOUT, |rank, g, e| {
            let t = Tensor::from_vec(vec![2, 2], ints(rank, 4)).unwrap();
            let s = Tensor::scalar(rank as i32 * 10);
            (CpuBackend::all_gather(t, &g, &e).unwrap(), CpuBackend::all_gather(s, &g, &e).unwrap())
        });
        let want: Vec<i64> = (0..3).flat_map(|r| ints(r, 4)).collect();
        for (t, s) in results {
            assert_eq!(t.shape(), [6, 2]);
            assert_eq!(t.as_slice::<i64>().unwrap(), want.as_slice());
            assert_eq!(s.shape(), [3]);
            assert_eq!(s.as_slice::<i32>().unwrap(), [0, 10, 20]);
        }
    }

    #[test]
    fn all_to_all_transposes_chunks() {
        let size = 3;
        let results = on_ranks(size, DEFAULT_TIMEOUT, move |rank, g, e| {
            // Row j of rank r holds 100·r + j, two columns.
            let v: Vec<i64> = (0..6).flat_map(|j| [100 * rank as i64 + j, -(100 * rank as i64 + j)]).collect();
            CpuBackend::all_to_all(Tensor::from_vec(vec![6, 2], v).unwrap(), &g, &e).unwrap()
        });
        for (rank, t) in results.iter().enumerate() {
            assert_eq!(t.shape(), [6, 2]);
            // Rank `rank` receives rows 2·rank and 2·rank+1 from each sender, in sender order.
            let want: Vec<i64> = (0..size as i64)
                .flat_map(|s| (0..2).map(move |k| 100 * s + 2 * rank as i64 + k))
                .flat_map(|v| [v, -v])
                .collect();
            assert_eq!(t.as_slice::<i64>().unwrap(), want.as_slice(), "rank {rank}");
        }
    }

    #[test]
    fn many_rounds_reuse_the_rendezvous() {
        let results = on_ranks(4, DEFAULT_TIMEOUT, |rank, g, e| {
            (0..200i64)
                .map(|k| {
                    let t = Tensor::from_vec(vec![1], vec![k * (rank as i64 + 1)]).unwrap();
                    CpuBackend::all_reduce(t, ReduceOp::Sum, &g, &e).unwrap().as_slice::<i64>().unwrap()[0]
                })
                .collect::<Vec<_>>()
        });
        let want: Vec<i64> = (0..200).map(|k| k * (1 + 2 + 3 + 4)).collect();
        assert!(results.iter().all(|r| *r == want));
    }

    #[test]
    fn disagreeing_ranks_all_get_the_error() {
        let results = on_ranks(2, DEFAULT_TIMEOUT, |rank, g, e| {
            let t = Tensor::from_vec(vec![rank + 1], vec![1f32; rank + 1]).unwrap();
            let shape = CpuBackend::all_reduce(t, ReduceOp::Sum, &g, &e).unwrap_err().to_string();
            let t = Tensor::from_vec(vec![2], vec![1f32; 2]).unwrap();
            let kind = if rank == 0 {
                CpuBackend::all_gather(t, &g, &e)
            } else {
                CpuBackend::all_reduce(t, ReduceOp::Max, &g, &e)
            };
            // The group still works after both errors.
            let ok = CpuBackend::all_reduce(Tensor::scalar(1i32), ReduceOp::Sum, &g, &e).unwrap();
            (shape, kind.unwrap_err().to_string(), ok.as_slice::<i32>().unwrap()[0])
        });
        for (shape, kind, ok) in results {
            assert!(shape.contains("rank 1 has f32[2]"), "{shape}");
            assert!(kind.contains("disagree") && kind.contains("all_gather"), "{kind}");
            assert_eq!(ok, 2);
        }
    }

    #[test]
    fn a_missing_rank_breaks_the_group_instead_of_hanging() {
        let results = on_ranks(2, Duration::from_millis(100), |rank, g, e| {
            if rank == 1 {
                return String::new();
            }
            let err = CpuBackend::all_gather(Tensor::scalar(1f32), &g, &e).unwrap_err().to_string();
            let again = CpuBackend::all_gather(Tensor::scalar(1f32), &g, &e).unwrap_err().to_string();
            assert!(again.contains("broken"), "{again}");
            err
        });
        assert!(results[0].contains("ranks without a call: [1]"), "{}", results[0]);
    }

    #[test]
    fn bad_shapes_for_all_to_all_and_bool_reductions_are_errors() {
        let t = Tensor::from_vec(vec![3], vec![1i64, 2, 3]).unwrap();
        assert!(exchange(&[&t, &t], 0).unwrap_err().to_string().contains("does not split into 2"));
        let b = Tensor::from_vec(vec![1], vec![true]).unwrap();
        assert!(reduce(&[&b], ReduceOp::Sum).unwrap_err().to_string().contains("bool"));
        let nan = Tensor::from_vec(vec![2], vec![f32::NAN, 1.0]).unwrap();
        let one = Tensor::from_vec(vec![2], vec![0.0f32, f32::NAN]).unwrap();
        let m = reduce(&[&nan, &one], ReduceOp::Max).unwrap();
        assert!(m.as_slice::<f32>().unwrap().iter().all(|v| v.is_nan()));
        let h = Tensor::from_vec(vec![1], vec![f16::from_f32(1.5)]).unwrap();
        assert_eq!(reduce(&[&h, &h, &h], ReduceOp::Sum).unwrap().as_slice::<f16>().unwrap(), [f16::from_f32(4.5)]);
    }
}
