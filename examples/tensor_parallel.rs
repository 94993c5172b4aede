//! Tensor parallelism with kiln's collectives: an MLP `y = relu(x·W1 + b1)·W2 + b2` split across ranks — W1 (and
//! b1) by columns, W2 by rows — each shard compiled by kiln and run on its own executor lane; the shards' partial
//! products are summed with an all-reduce and the bias added once. The result equals the unsplit model's.
//!
//! `cargo run --example tensor_parallel [RANKS]` (default 2; the hidden width must divide by RANKS).

use std::collections::BTreeMap;

use kiln::ir::{Builder, DType, Shape, Tensor};
use kiln::{CompileOptions, Model};
use kiln_runtime::contract::{CollectiveBackend, ReduceOp};
use kiln_runtime::cpu::{CpuBackend, CpuExecutor, LocalGroup};

const BATCH: usize = 4;
const D_IN: usize = 32;
const HIDDEN: usize = 64;
const D_OUT: usize = 8;

/// A deterministic weight with values in about [-scale, scale].
fn weight(shape: &[usize], seed: u64, scale: f64) -> Tensor {
    let t = Tensor::random(DType::F32, shape.to_vec(), seed);
    Tensor::from_vec(shape.to_vec(), t.to_f64_vec().iter().map(|v| (v * scale) as f32).collect()).expect("same length")
}

/// Columns `cols` of a row-major `[rows, n]` matrix (a 1-D tensor is one row).
fn columns(t: &Tensor, cols: std::ops::Range<usize>) -> Tensor {
    let n = *t.shape().last().expect("not a scalar");
    let v = t.as_slice::<f32>().expect("f32");
    let rows = v.len() / n;
    let picked: Vec<f32> = (0..rows).flat_map(|r| v[r * n + cols.start..r * n + cols.end].to_vec()).collect();
    let mut shape = t.shape().to_vec();
    *shape.last_mut().expect("not a scalar") = cols.len();
    Tensor::from_vec(shape, picked).expect("sizes agree")
}

/// Rows `rows` of a row-major `[m, n]` matrix.
fn rows(t: &Tensor, rows: std::ops::Range<usize>) -> Tensor {
    let n = t.shape()[1];
    let v = t.as_slice::<f32>().expect("f32");
    Tensor::from_vec(vec![rows.len(), n], v[rows.start * n..rows.end * n].to_vec()).expect("sizes agree")
}

/// `relu(x·w1 + b1)·w2`, plus `b2` when given.
fn mlp(w1: Tensor, b1: Tensor, w2: Tensor, b2: Option<Tensor>) -> Result<Model, Box<dyn std::error::Error>> {
    let mut b = Builder::new("mlp");
    let x = b.input("x", DType::F32, Shape::of(&[BATCH as u64, D_IN as u64]))?;
    let (w1, b1, w2) = (b.weight("w1", w1)?, b.weight("b1", b1)?, b.weight("w2", w2)?);
    let h = b.matmul(x, w1)?;
    let h = b.add(h, b1)?;
    let h = b.relu(h)?;
    let mut y = b.matmul(h, w2)?;
    if let Some(b2) = b2 {
        let b2 = b.weight("b2", b2)?;
        y = b.add(y, b2)?;
    }
    b.output("y", y);
    Ok(Model::from_graph(b.finish())?)
}

/// Runs the MLP unsplit and split across `ranks`; returns the largest absolute difference.
pub fn run(ranks: usize) -> Result<f32, Box<dyn std::error::Error>> {
    if ranks == 0 || !HIDDEN.is_multiple_of(ranks) {
        return Err(format!("the hidden width {HIDDEN} does not split into {ranks} ranks").into());
    }
    let (w1, b1) = (weight(&[D_IN, HIDDEN], 1, 0.3), weight(&[HIDDEN], 2, 0.1));
    let (w2, b2) = (weight(&[HIDDEN, D_OUT], 3, 0.3), weight(&[D_OUT], 4, 0.1));
    let x = weight(&[BATCH, D_IN], 5, 1.0);
    let inputs = BTreeMap::from([("x".to_string(), x)]);
    let options = CompileOptions { threads: 1, ..CompileOptions::default() };

    let full = mlp(w1.clone(), b1.clone(), w2.clone(), Some(b2.clone()))?.compile(&options)?.run(&inputs)?;

    let share = HIDDEN / ranks;
    let groups = LocalGroup::new(ranks)?;
    let mut workers = Vec::new();
    for (rank, group) in groups.into_iter().enumerate() {
        let cols = rank * share..(rank + 1) * share;
        let shard =
            mlp(columns(&w1, cols.clone()), columns(&b1, cols.clone()), rows(&w2, cols), None)?.compile(&options)?;
        let inputs = inputs.clone();
        workers.push(std::thread::spawn(move || -> Result<Tensor, String> {
            let lane = CpuExecutor::new(format!("shard{rank}")).map_err(|e| e.to_string())?;
            let partial = shard.submit(&lane, inputs).map_err(|e| e.to_string())?.wait().map_err(|e| e.to_string())?;
            let (_, partial) = partial.into_iter().next().ok_or("the shard has no output")?;
            CpuBackend::all_reduce(partial, ReduceOp::Sum, &group, &lane).map_err(|e| e.to_string())
        }));
    }
    let mut worst = 0f32;
    for (rank, worker) in workers.into_iter().enumerate() {
        let sum = worker.join().map_err(|_| format!("rank {rank} panicked"))??;
        let want = full[0].1.as_slice::<f32>().ok_or("f32 output")?;
        for (i, (got, want)) in sum.as_slice::<f32>().ok_or("f32 sum")?.iter().zip(want).enumerate() {
            worst = worst.max((got + b2.as_slice::<f32>().ok_or("f32 bias")?[i % D_OUT] - want).abs());
        }
    }
    Ok(worst)
}

#[allow(dead_code)] // included by tests/tensor_parallel.rs, which calls `run` only
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ranks = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(2);
    let worst = run(ranks)?;
    println!("tensor-parallel MLP on {ranks} ranks: max |split - unsplit| = {worst:e}");
    if worst > 1e-5 {
        return Err("the split model differs from the unsplit one".into());
    }
    Ok(())
}
