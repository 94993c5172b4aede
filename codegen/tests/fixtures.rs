//! Every fixture graph in `tests/fixtures/*.kir` that holds only lowerable ops and no parameters lowers as one
//! group and matches the interpreter; every other fixture is refused with an error naming its first
//! non-lowerable node, never a panic.

mod common;

use common::{check_kernel, lower_whole};
use kiln_codegen::kernel::LowerError;

/// Symbol values for the fixtures that have symbolic inputs.
const BINDINGS: &[(&str, u64)] = &[("batch", 3), ("seq", 2)];

#[test]
fn lowerable_fixtures_match_the_interpreter() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut paths: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    paths.retain(|p| p.extension().is_some_and(|e| e == "kir"));
    paths.sort();
    let (mut lowered, mut refused) = (Vec::new(), Vec::new());
    for path in paths {
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let g = kiln_ir::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
        if g.params().next().is_some() {
            refused.push(name);
            continue;
        }
        match lower_whole(&g, &name) {
            Ok(k) => {
                check_kernel(&name, &g, &k, BINDINGS);
                lowered.push(name);
            }
            Err(LowerError::Unsupported { .. }) => refused.push(name),
            Err(e) => panic!("{name}: {e}"),
        }
    }
    assert_eq!(
        lowered,
        [
            "elementwise_broadcast",
            "float_literals",
            "integer_ops",
            "iota_shape_of",
            "names_and_comments",
            "reductions",
            "resize",
            "select_compare_cast",
            "softmax_layer_norm",
            "whole_tensor_reductions",
        ]
    );
    assert_eq!(
        refused,
        [
            "batch_norm_channelwise",
            "control_flow",
            "conv3x3_layers",
            "conv_pool",
            "conv_symbolic",
            "data_dependent",
            "fusion",
            "grid_sample",
            "integer_max_pool",
            "lstm_gru",
            "mlp_params",
            "mlp_symbolic_batch",
            "multi_result",
            "nested_regions",
            "params_only",
            "qdq_matmul",
            "roi_align",
            "shape_ops",
            "top_k",
        ]
    );
}

/// The op table's `Fusibility` promises that fusion may put an `Elementwise` or `Loop` op in a loop group: every
/// such node of every fixture must lower on its own (a refusal here would be a group the backend cannot compile).
#[test]
fn ops_the_op_table_calls_fusible_lower_alone() {
    use kiln_ir::op::Fusibility;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut checked = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "kir") {
            continue;
        }
        let g = kiln_ir::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for id in g.node_ids() {
            let op = &g.node(id).op;
            if !matches!(op.fusibility(), Fusibility::Elementwise | Fusibility::Channelwise | Fusibility::Loop) {
                continue;
            }
            let options = kiln_codegen::kernel::LowerOptions { spaces: kiln_codegen::kernel::SpacePolicy::Separate };
            if let Err(e) = kiln_codegen::kernel::lower_with(&g, &[id], "k", &options) {
                panic!("{}: {} does not lower alone: {e}", path.display(), g.describe(id));
            }
            checked.insert(op.mnemonic());
        }
    }
    // The fixtures hold every fusible op kind the table names (elementwise kinds are spot-checked).
    for mnemonic in ["select", "cast", "gelu", "broadcast", "reshape", "transpose", "reduce", "softmax", "layer_norm"] {
        assert!(checked.contains(mnemonic), "no fixture exercises `{mnemonic}`: {checked:?}");
    }
}
