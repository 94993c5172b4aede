//! Builds the bundled default model (`examples/models/tiny_cnn.kir` + `.safetensors`) with the builder API,
//! runs it through the interpreter, and writes it out. `cargo run --example build_model [OUT_DIR]`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kiln::ir::op::{Conv, Op, Pool, PoolKind, ReduceKind};
use kiln::ir::{Builder, DType, Shape, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "examples/models".into()));
    let mut b = Builder::new("tiny_cnn");
    let x = b.input("image", DType::F32, Shape::of(&[1, 1, 28, 28]))?;
    let conv = |strides: usize| Conv {
        strides: vec![1; strides],
        pads: vec![1; 2 * strides],
        dilations: vec![1; strides],
        groups: 1,
    };
    // Weights are seeded pseudo-random values scaled to keep activations in a sane range.
    let w = |shape: Vec<usize>, seed: u64, scale: f64| {
        let t = Tensor::random(DType::F32, shape.clone(), seed);
        Tensor::from_vec(shape, t.to_f64_vec().iter().map(|v| (v * scale) as f32).collect()).expect("same length")
    };
    let w1 = b.weight("conv1.weight", w(vec![8, 1, 3, 3], 1, 0.5))?;
    let b1 = b.weight("conv1.bias", w(vec![8], 2, 0.1))?;
    let h = b.op(Op::Conv(conv(2)), &[x, w1, b1])?;
    let h = b.relu(h)?;
    let pool = Pool {
        kind: PoolKind::Max,
        kernel: vec![2, 2],
        strides: vec![2, 2],
        pads: vec![0; 4],
        dilations: vec![1, 1],
        ceil_mode: false,
        count_include_pad: false,
    };
    let h = b.op(Op::Pool(pool), &[h])?;
    let w2 = b.weight("conv2.weight", w(vec![16, 8, 3, 3], 3, 0.2))?;
    let b2 = b.weight("conv2.bias", w(vec![16], 4, 0.1))?;
    let h = b.op(Op::Conv(conv(2)), &[h, w2, b2])?;
    let h = b.relu(h)?;
    let h = b.reduce(ReduceKind::Mean, h, &[2, 3], false)?;
    let w3 = b.weight("fc.weight", w(vec![16, 10], 5, 0.5))?;
    let b3 = b.weight("fc.bias", w(vec![10], 6, 0.1))?;
    let logits = b.matmul(h, w3)?;
    let logits = b.add(logits, b3)?;
    let probs = b.softmax(logits, -1)?;
    b.output("logits", logits);
    b.output("probs", probs);
    let model = kiln::Model::from_graph(b.finish())?;

    let inputs = model.random_inputs(&BTreeMap::new(), 0)?;
    for (name, t) in model.run(&inputs, &kiln::RunOptions::default())? {
        println!("{name}: {}", t.tensor_type());
    }
    std::fs::create_dir_all(&out_dir)?;
    std::fs::write(out_dir.join("tiny_cnn.kir"), kiln::ir::print(model.graph()))?;
    kiln::weights::save(&out_dir.join("tiny_cnn.safetensors"), &model.graph().weights)?;
    println!("wrote {}", out_dir.join("tiny_cnn.kir").display());
    Ok(())
}
