//! `kiln inspect`: inputs, outputs, op histogram, parameter count and bytes of a model; what a compiled
//! artifact's manifest says; with `--placement`, where each compiled step runs.

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
    /// Show where each step of the compiled model runs and why: the registry's placement (the built-in
    /// backends and `KILN_BACKEND_PLUGINS`). MODEL may also be a compiled artifact.
    #[arg(long)]
    placement: bool,
}

pub fn run(a: InspectArgs) -> Result<()> {
    if a.placement {
        return placement(&a);
    }
    if kiln::Artifact::is_artifact(&a.model.model) {
        // A compiled artifact: what its manifest says (as `kiln-serve inspect` prints it), checked.
        let artifact = kiln::Artifact::open(&a.model.model)?;
        if a.json {
            println!("{}", serde_json::to_string(artifact.manifest())?);
        } else {
            print!("{}", artifact.manifest().summary(&a.model.model));
        }
        return Ok(());
    }
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
    // An ONNX model's own op types, beside the IR ops they became.
    let onnx_ops: Option<Vec<(String, usize)>> = if a.model.model.extension().is_some_and(|e| e == "onnx") {
        let mut v: Vec<(String, usize)> = kiln_onnx::op_types(&a.model.model)
            .map_err(|e| kiln::Error::OnnxAt(e, a.model.model.display().to_string()))?
            .into_iter()
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        Some(v)
    } else {
        None
    };
    if a.json {
        let v = serde_json::json!({
            "graph": g.name(),
            "nodes": g.len(),
            "inputs": inputs.iter().map(|(n, t)| serde_json::json!({"name": n, "type": t})).collect::<Vec<_>>(),
            "outputs": outputs.iter().map(|(n, t)| serde_json::json!({"name": n, "type": t})).collect::<Vec<_>>(),
            "ops": ops.iter().map(|(m, c)| serde_json::json!({"op": m, "count": c})).collect::<Vec<_>>(),
            "onnx_ops": onnx_ops.as_ref().map(|v| {
                v.iter().map(|(m, c)| serde_json::json!({"op_type": m, "count": c})).collect::<Vec<_>>()
            }),
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
    if let Some(onnx_ops) = &onnx_ops {
        println!("ONNX ops:");
        for (m, c) in onnx_ops {
            println!("  {c:>6}  {m}");
        }
    }
    println!("ops (kiln IR):");
    for (m, c) in &ops {
        println!("  {c:>6}  {m}");
    }
    println!("parameters: {params} tensors, {param_elems} elements, {}", human_bytes(param_bytes));
    Ok(())
}

/// `kiln inspect --placement`: the compiled model's steps (a model is lowered for the CPU with the registry;
/// an artifact shows what was compiled into it), each with its backend and the reason.
fn placement(a: &InspectArgs) -> Result<()> {
    let registry = super::registry()?;
    let (exe, compiled_as) = if kiln::Artifact::is_artifact(&a.model.model) {
        let artifact = kiln::Artifact::open(&a.model.model)?;
        let m = artifact.manifest();
        (m.common().executable.clone(), m.kind())
    } else {
        let model = a.model.load()?;
        let options = kiln::CompileOptions { backends: registry.clone(), ..Default::default() };
        (model.lower(&options)?.executable, "cpu")
    };
    let steps = kiln_runtime::placement::explain(&exe, &registry, compiled_as);
    let mut per_backend: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &steps {
        *per_backend.entry(&s.backend).or_default() += 1;
    }
    if a.json {
        let v = serde_json::json!({
            "graph": exe.name,
            "compiled_as": compiled_as,
            "registry": registry.describe(),
            "steps": steps,
            "per_backend": per_backend,
        });
        println!("{v}");
        return Ok(());
    }
    println!("registry (best first):");
    for line in registry.describe() {
        println!("  {line}");
    }
    println!("steps of {} ({} in all):", exe.name, steps.len());
    let width = steps.iter().map(|s| s.backend.len()).max().unwrap_or(0);
    for s in &steps {
        println!("  {:<11} {:<width$}  {}  -- {}", s.step, s.backend, s.what, s.why);
    }
    let summary: Vec<String> = per_backend.iter().map(|(b, n)| format!("{b}: {n}")).collect();
    println!("steps per backend: {}", summary.join(", "));
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
