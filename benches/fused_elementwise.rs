//! `cargo bench --bench fused_elementwise`: one fused elementwise kernel against the machine's copy bandwidth.
//!
//! `y = gelu(x * a + b) + r` over 16M f32 (`x`, `r`: [4096, 4096]; `a`, `b`: per-column [4096]) compiled for the
//! CPU on one thread and on two, timed against `copy_from_slice` of 64 MiB on one thread in the same run. The
//! kernel moves 3 × 64 MiB (reads x and r, writes y); the copy moves 2 × 64 MiB. The figure of merit is the
//! kernel's bandwidth as a fraction of the copy's. `scripts/bench_vs_ort.py --elementwise` times ONNX Runtime on the same graph.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kiln::{CompileOptions, Model};
use kiln_ir::Tensor;

const N: usize = 4096;

/// As the `kiln` binary: freed blocks are reused, not faulted in again each run (see `src/main.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    // The graph is examples/models/fused_gelu.kir, which scripts/gpu-check.sh benchmarks on a GPU.
    let text = include_str!("../examples/models/fused_gelu.kir");
    let model = Model::from_graph(kiln_ir::parse(text).expect("the bench graph parses")).expect("verifies");
    let inputs: BTreeMap<String, Tensor> = model.random_inputs(&BTreeMap::new(), 1).expect("inputs");
    let runs = 10;

    let src = vec![1.0f32; N * N];
    let mut dst = vec![0.0f32; N * N];
    dst.copy_from_slice(&src);
    let copy: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            t.elapsed()
        })
        .collect();
    let mib = (N * N * 4) as f64 / (1 << 20) as f64;
    let gbps = |bytes: f64, d: Duration| bytes * (1 << 20) as f64 / d.as_secs_f64() / 1e9;
    let c = median(copy);
    let cb = gbps(2.0 * mib, c);
    println!("fused y = gelu(x*a + b) + r over {N}x{N} f32, median of {runs}:");
    println!("  memcpy (1 thread)      {:8.2} ms  {cb:6.2} GB/s", c.as_secs_f64() * 1e3);

    for threads in [1, 2] {
        let compiled = model.compile(&CompileOptions { threads, ..CompileOptions::default() }).expect("compiles");
        let report = compiled.report();
        assert_eq!(report.steps[0] + report.steps[2], 0, "the bench graph must be one generated kernel");
        for _ in 0..2 {
            compiled.run(&inputs).expect("runs");
        }
        let whole: Vec<Duration> = (0..runs)
            .map(|_| {
                let t = Instant::now();
                compiled.run(&inputs).expect("runs");
                t.elapsed()
            })
            .collect();
        // A run also hands back a fresh 64 MiB output tensor; the kernel's own time is what the profile reports.
        let kernel: Vec<Duration> = (0..runs)
            .map(|_| compiled.profile(&inputs).expect("profiles").iter().map(|(_, t)| *t).sum::<Duration>())
            .collect();
        let (w, k) = (median(whole), median(kernel));
        let (wb, kb) = (gbps(3.0 * mib, w), gbps(3.0 * mib, k));
        println!("  {threads} thread(s): whole run {:8.2} ms  {wb:6.2} GB/s", w.as_secs_f64() * 1e3);
        println!(
            "  {threads} thread(s): kernel    {:8.2} ms  {kb:6.2} GB/s  = {:.0}% of the 1-thread copy bandwidth",
            k.as_secs_f64() * 1e3,
            100.0 * kb / cb
        );
    }
}
