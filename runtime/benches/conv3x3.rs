//! `cargo bench -p kiln-codegen --bench conv3x3`: the 3×3 stride-1 convolutions of ResNet-18 (batch 1), im2col +
//! GEMM (`conv_f32`) against Winograd F(2×2, 3×3) (`conv_winograd_f32`, weights transformed beforehand), one
//! thread and two, best of 20 runs each, in the same run.

use std::time::{Duration, Instant};

use kiln_ir::op::Conv;
use kiln_runtime::library::{Par, WinogradWeights, conv_f32, conv_winograd_f32};

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| (((i * 2654435761 + seed * 97) % 2000) as f32 / 1000.0) - 1.0).collect()
}

fn best(mut f: impl FnMut()) -> Duration {
    f();
    (0..20)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .expect("runs")
}

fn main() {
    let attrs = Conv { strides: vec![1, 1], pads: vec![1; 4], dilations: vec![1, 1], groups: 1 };
    println!("3x3 stride-1 conv, batch 1: im2col+gemm vs Winograd F(2x2,3x3), best of 20");
    for (c, hw) in [(64usize, 56usize), (128, 28), (256, 14), (512, 7)] {
        let x = values(c * hw * hw, 1);
        let w = values(c * c * 9, 2);
        let bias = values(c, 3);
        let shape = [1, c, hw, hw];
        let wt = WinogradWeights::transform(&w, &[c, c, 3, 3]).expect("3x3 weights");
        let mut y = vec![0f32; c * hw * hw];
        for threads in [1, 2] {
            let par = Par { threads };
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
            let direct = pool.install(|| {
                best(|| {
                    conv_f32(&x, &shape, &w, &[c, c, 3, 3], Some(&bias), &attrs, &mut y, &shape, None, par)
                        .expect("conv")
                })
            });
            let winograd = pool.install(|| {
                best(|| conv_winograd_f32(&x, &shape, &wt, Some(&bias), &attrs, &mut y, &shape, par).expect("conv"))
            });
            let gflop = 2.0 * (c * c * 9 * hw * hw) as f64 / 1e9;
            println!(
                "  C=M={c:3} {hw:2}x{hw:<2} {threads}t: im2col {:7.3} ms ({:5.1} GF/s)  winograd {:7.3} ms ({:5.1} GF/s eq.)  ratio {:.2}",
                direct.as_secs_f64() * 1e3,
                gflop / direct.as_secs_f64(),
                winograd.as_secs_f64() * 1e3,
                gflop / winograd.as_secs_f64(),
                direct.as_secs_f64() / winograd.as_secs_f64()
            );
        }
    }
}
