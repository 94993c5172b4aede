//! `cargo bench -p kiln-runtime --bench conv3x3`: 3×3 stride-1 convolutions (batch 1) — ResNet-18's, and the
//! narrower ones of SqueezeNet-class and small models — im2col + GEMM (`conv_f32`) against Winograd F(2×2, 3×3)
//! (`conv_winograd_f32`, weights transformed beforehand), one thread and two, best of 20 runs each, in the same run.

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

/// (input channels, output channels, height, width): ResNet-18's layers, then SqueezeNet's and small models'.
#[rustfmt::skip]
const SHAPES: [(usize, usize, usize, usize); 16] = [
    (16, 32, 8, 48), (16, 32, 16, 16),
    (64, 64, 56, 56), (128, 128, 28, 28), (256, 256, 14, 14), (512, 512, 7, 7),
    (16, 64, 55, 55), (32, 128, 27, 27), (48, 192, 13, 13), (64, 64, 13, 13),
    (8, 8, 17, 23), (8, 8, 32, 12), (3, 16, 64, 64), (3, 64, 112, 112), (16, 16, 28, 28), (24, 24, 28, 28),
];

fn main() {
    let attrs = Conv { strides: vec![1, 1], pads: vec![1; 4], dilations: vec![1, 1], groups: 1 };
    println!("3x3 stride-1 conv, batch 1: im2col+gemm vs Winograd F(2x2,3x3), best of 20");
    for (c, m, h, wd) in SHAPES {
        let x = values(c * h * wd, 1);
        let w = values(m * c * 9, 2);
        let bias = values(m, 3);
        let shape = [1, c, h, wd];
        let y_shape = [1, m, h, wd];
        let wt = WinogradWeights::transform(&w, &[m, c, 3, 3]).expect("3x3 weights");
        let mut y = vec![0f32; m * h * wd];
        for threads in [1, 2] {
            let par = Par { threads };
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
            let direct = pool.install(|| {
                best(|| {
                    conv_f32(&x, &shape, &w, &[m, c, 3, 3], Some(&bias), &attrs, &mut y, &y_shape, None, par)
                        .expect("conv")
                })
            });
            let winograd = pool.install(|| {
                best(|| conv_winograd_f32(&x, &shape, &wt, Some(&bias), &attrs, &mut y, &y_shape, par).expect("conv"))
            });
            let gflop = 2.0 * (m * c * 9 * h * wd) as f64 / 1e9;
            println!(
                "  C={c:3} M={m:3} {h:2}x{wd:<2} {threads}t: im2col {:7.3} ms ({:5.1} GF/s)  winograd {:7.3} ms ({:5.1} GF/s eq.)  ratio {:.2}",
                direct.as_secs_f64() * 1e3,
                gflop / direct.as_secs_f64(),
                winograd.as_secs_f64() * 1e3,
                gflop / winograd.as_secs_f64(),
                direct.as_secs_f64() / winograd.as_secs_f64()
            );
        }
    }
}
