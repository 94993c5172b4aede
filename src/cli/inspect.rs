//! `kiln inspect`: inputs, outputs, op histogram, parameter count and bytes.

use std::collections::BTreeMap;

use anyhow::Result;
use clap::Args;

use super::ModelArgs;

/// Arguments of `kiln inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: InspectArgs) -> Result<()> {
    let model = a.model.load()?;
    let g = model.graph();
    let mut histogram: BTreeMap<&str, usize> = BTreeMap::new();
    for id in g.node_ids() {
        *histogram.entry(g.node(id).op.mnemonic()).or_default() += 1;
    }
    let mut ops: Vec<(&str, usize)> = histogram.into_iter().collect();
    ops.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let (param_elems, param_bytes) = g.parameter_footprint();
    let params = g.params().count();
    let outputs: Vec<(String, String)> = g
        .outputs()
        .iter()
        .map(|(n, v)| (n.clone(), g.value_type(*v).map(|t| t.to_string()).unwrap_or_else(|| "?".into())))
        .collect();
    let inputs: Vec<(String, String)> = model.inputs().into_iter().map(|(n, t)| (n, t.to_string())).collect();
    if a.json {
        let v = serde_json::json!({
            "graph": g.name(),
            "nodes": g.len(),
            "inputs": inputs.iter().map(|(n, t)| serde_json::json!({"name": n, "type": t})).collect::<Vec<_>>(),
            "outputs": outputs.iter().map(|(n, t)| serde_json::json!({"name": n, "type": t})).collect::<Vec<_>>(),
            "ops": ops.iter().map(|(m, c)| serde_json::json!({"op": m, "count": c})).collect::<Vec<_>>(),
            "parameters": params,
            "parameter_elements": param_elems,
            "parameter_bytes": param_bytes,
        });
        println!("{v}");
        return Ok(());
    }
    println!("graph {} ({} nodes)", g.name(), g.len());
    println!("inputs:");
    for (n, t) in &inputs {
        println!("  {n}: {t}");
    }
    println!("outputs:");
    for (n, t) in &outputs {
        println!("  {n}: {t}");
    }
    println!("ops:");
    for (m, c) in &ops {
        println!("  {c:>6}  {m}");
    }
    println!("parameters: {params} tensors, {param_elems} elements, {}", human_bytes(param_bytes));
    Ok(())
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.2} GiB ({b} bytes)", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.2} MiB ({b} bytes)", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.2} KiB ({b} bytes)", b as f64 / 1024.0),
        b => format!("{b} bytes"),
    }
}
