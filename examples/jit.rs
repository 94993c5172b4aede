//! The JIT library API: load a model, compile it for the CPU once, run it many times — here from four threads at
//! once, sharing one compiled model.
//!
//! ```sh
//! cargo run --release --example jit [MODEL]   # default: examples/models/tiny_cnn.kir (weights beside it)
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use kiln::{CompileOptions, LoadOptions, Model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/models/tiny_cnn.kir"));
    let model = Model::load(&path, &LoadOptions::default())?;

    let t = Instant::now();
    let compiled = model.compile(&CompileOptions { threads: 1, ..CompileOptions::default() })?;
    let r = compiled.report();
    println!(
        "compiled {} in {:.1} ms: {} kernels, {} library calls, {} interpreter fallbacks",
        path.display(),
        t.elapsed().as_secs_f64() * 1e3,
        r.kernels,
        r.steps[0],
        r.steps[2]
    );

    // Symbolic dims (if any) take the value 1 for this demo.
    let shapes: BTreeMap<String, Vec<usize>> = model
        .inputs()
        .into_iter()
        .map(|(n, t)| (n, t.shape.0.iter().map(|d| d.as_static().unwrap_or(1) as usize).collect()))
        .collect();
    std::thread::scope(|s| -> Result<(), kiln::Error> {
        let handles: Vec<_> = (0..4u64)
            .map(|seed| {
                let (compiled, model, shapes) = (&compiled, &model, &shapes);
                s.spawn(move || -> Result<(), kiln::Error> {
                    let inputs = model.random_inputs(shapes, seed)?;
                    let t = Instant::now();
                    let outputs = compiled.run(&inputs)?;
                    let summary: Vec<String> =
                        outputs.iter().map(|(n, t)| format!("{n}: {}", t.tensor_type())).collect();
                    println!("thread {seed}: {} in {:.3} ms", summary.join(", "), t.elapsed().as_secs_f64() * 1e3);
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a worker thread panicked")?;
        }
        Ok(())
    })?;
    Ok(())
}
