//! Collectives across processes: run under `mpirun -np N` (N ≥ 1). Every rank checks all-reduce (sum, max),
//! all-gather and all-to-all against plain arithmetic on what every rank contributed (each rank's inputs are a
//! function of its rank, so every rank can compute the expected results), checks that a shape mismatch is an
//! error on every rank, and runs a tensor-parallel MLP (first layer split by columns, second by rows, partial
//! products all-reduced) against the unsplit MLP. Exits non-zero on any mismatch.
//!
//! `cargo build -p kiln-runtime --features mpi --example mpi_collectives`
//! `mpirun -np 2 target/debug/examples/mpi_collectives`

use kiln_ir::Tensor;
use kiln_runtime::contract::{CollectiveBackend, CollectiveGroup, ReduceOp};
use kiln_runtime::cpu::CpuExecutor;
use kiln_runtime::cpu::mpi::{MpiBackend, MpiGroup};

fn ints(rank: usize, n: usize) -> Vec<i64> {
    (0..n).map(|i| (i as i64 * 7 - rank as i64 * 13) % 11).collect()
}

fn floats(rank: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 31 + rank * 17) % 23) as f32 * 0.37 - 4.0).collect()
}

/// A deterministic matrix with values in about [-1, 1].
fn matrix(rows: usize, cols: usize, salt: usize) -> Vec<f32> {
    (0..rows * cols).map(|i| (((i * 2654435761 + salt * 40503) % 1000) as f32 / 500.0) - 1.0).collect()
}

/// `a[m,k] @ b[k,n]` for row-major slices.
fn matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for p in 0..k {
            for j in 0..n {
                c[i * n + j] += a[i * k + p] * b[p * n + j];
            }
        }
    }
    c
}

fn check(ok: bool, what: &str, failures: &mut Vec<String>) {
    if !ok {
        failures.push(what.to_string());
    }
}

fn main() {
    let group = match MpiGroup::world() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("mpi_collectives: {e}");
            std::process::exit(2);
        }
    };
    let (rank, size) = (group.rank(), group.size());
    let lane = CpuExecutor::new(format!("mpi-rank{rank}")).expect("executor");
    let mut failures = Vec::new();

    // All-reduce: integers exactly, floats within 1e-6.
    let t = Tensor::from_vec(vec![3, 4], ints(rank, 12)).unwrap();
    let sum = MpiBackend::all_reduce(t.clone(), ReduceOp::Sum, &group, &lane).unwrap();
    let max = MpiBackend::all_reduce(t, ReduceOp::Max, &group, &lane).unwrap();
    let want_sum: Vec<i64> = (0..12).map(|k| (0..size).map(|r| ints(r, 12)[k]).sum()).collect();
    let want_max: Vec<i64> = (0..12).map(|k| (0..size).map(|r| ints(r, 12)[k]).max().unwrap()).collect();
    check(sum.as_slice::<i64>() == Some(&want_sum[..]) && sum.shape() == [3, 4], "all_reduce sum i64", &mut failures);
    check(max.as_slice::<i64>() == Some(&want_max[..]), "all_reduce max i64", &mut failures);
    let f = Tensor::from_vec(vec![12], floats(rank, 12)).unwrap();
    let fsum = MpiBackend::all_reduce(f, ReduceOp::Sum, &group, &lane).unwrap();
    let close = fsum.as_slice::<f32>().unwrap().iter().enumerate().all(|(k, got)| {
        let want: f64 = (0..size).map(|r| floats(r, 12)[k] as f64).sum();
        (*got as f64 - want).abs() <= 1e-6 * want.abs().max(1.0)
    });
    check(close, "all_reduce sum f32", &mut failures);

    // All-gather in rank order.
    let g = MpiBackend::all_gather(Tensor::from_vec(vec![2, 2], ints(rank, 4)).unwrap(), &group, &lane).unwrap();
    let want: Vec<i64> = (0..size).flat_map(|r| ints(r, 4)).collect();
    check(g.shape() == [2 * size, 2] && g.as_slice::<i64>() == Some(&want[..]), "all_gather", &mut failures);

    // All-to-all: row j of rank r holds 100·r + j; rank `rank` receives row `rank` of every sender.
    let rows: Vec<i64> = (0..size).map(|j| 100 * rank as i64 + j as i64).collect();
    let x = MpiBackend::all_to_all(Tensor::from_vec(vec![size], rows).unwrap(), &group, &lane).unwrap();
    let want: Vec<i64> = (0..size).map(|s| 100 * s as i64 + rank as i64).collect();
    check(x.as_slice::<i64>() == Some(&want[..]), "all_to_all", &mut failures);

    // A shape mismatch is an error on every rank, and the group keeps working.
    if size > 1 {
        let bad = Tensor::from_vec(vec![rank + 1], vec![1f32; rank + 1]).unwrap();
        match MpiBackend::all_gather(bad, &group, &lane) {
            Err(e) => check(e.to_string().contains("disagree"), "mismatch error names the disagreement", &mut failures),
            Ok(_) => check(false, "a shape mismatch must fail", &mut failures),
        }
    }

    // Tensor parallelism: y = relu(x·W1 + b1)·W2 + b2, W1 split by columns and W2 by rows across ranks.
    let (batch, d_in, hidden, d_out) = (2, 8, 16 * size, 4);
    let (x, w1, b1, w2, b2) = (
        matrix(batch, d_in, 1),
        matrix(d_in, hidden, 2),
        matrix(1, hidden, 3),
        matrix(hidden, d_out, 4),
        matrix(1, d_out, 5),
    );
    let full = {
        let mut h = matmul(&x, &w1, batch, d_in, hidden);
        for (i, v) in h.iter_mut().enumerate() {
            *v = (*v + b1[i % hidden]).max(0.0);
        }
        let mut y = matmul(&h, &w2, batch, hidden, d_out);
        for (i, v) in y.iter_mut().enumerate() {
            *v += b2[i % d_out];
        }
        y
    };
    let share = hidden / size;
    let cols = rank * share..(rank + 1) * share;
    let w1_shard: Vec<f32> =
        (0..d_in).flat_map(|r| w1[r * hidden + cols.start..r * hidden + cols.end].to_vec()).collect();
    let mut h = matmul(&x, &w1_shard, batch, d_in, share);
    for (i, v) in h.iter_mut().enumerate() {
        *v = (*v + b1[cols.start + i % share]).max(0.0);
    }
    let partial = matmul(&h, &w2[cols.start * d_out..cols.end * d_out], batch, share, d_out);
    let y =
        MpiBackend::all_reduce(Tensor::from_vec(vec![batch, d_out], partial).unwrap(), ReduceOp::Sum, &group, &lane)
            .unwrap();
    let worst = y
        .as_slice::<f32>()
        .unwrap()
        .iter()
        .zip(&full)
        .enumerate()
        .map(|(i, (a, b))| (a + b2[i % d_out] - b).abs())
        .fold(0f32, f32::max);
    check(worst <= 1e-5, &format!("tensor-parallel MLP (max difference {worst:e})"), &mut failures);

    if failures.is_empty() {
        println!(
            "mpi rank {rank} of {size}: all collective checks passed (tensor-parallel MLP max difference {worst:e})"
        );
    } else {
        eprintln!("mpi rank {rank} of {size}: FAILED: {}", failures.join("; "));
        std::process::exit(1);
    }
}
