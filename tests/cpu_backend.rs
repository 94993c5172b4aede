//! The CPU backend end to end: every fixture compiled for the CPU matches the interpreter; every reference
//! model matches ONNX Runtime's saved outputs (rtol 1e-3, atol 1e-4); bad inputs are clear errors; NaN and Inf
//! propagate as in the interpreter; one compiled model runs from several threads at once.

use std::collections::BTreeMap;

use kiln::{Backend, CompileOptions, Model};
use kiln_ir::{DType, Tensor};

mod common;

/// Equal for integers and bools; within rtol 1e-4 (atol 1e-5) for floats; NaN matches NaN.
fn assert_close(what: &str, got: &[(String, Tensor)], want: &[(String, Tensor)]) {
    common::assert_outputs(what, got, want, 1e-4, 1e-5);
}

/// The largest finite magnitude among float outputs (at least 1): an f32 sum's rounding error grows with the
/// magnitude of its terms, not of its result, so a result that cancels to near zero from terms of size 20 (a
/// 288-term conv) is compared with an absolute tolerance in proportion to the outputs' scale.
fn scale_of(want: &[(String, Tensor)]) -> f64 {
    let finite_max = |v: &mut dyn Iterator<Item = f64>| v.filter(|x| x.is_finite()).fold(1.0f64, |m, x| m.max(x.abs()));
    want.iter()
        .map(|(_, t)| match (t.as_slice::<f32>(), t.as_slice::<f64>()) {
            (Some(v), _) => finite_max(&mut v.iter().map(|&x| x as f64)),
            (_, Some(v)) => finite_max(&mut v.iter().copied()),
            _ => 1.0,
        })
        .fold(1.0, f64::max)
}

#[test]
fn every_fixture_matches_the_interpreter() {
    for (name, mut g) in common::fixtures() {
        common::bind_weights(&mut g);
        let model = Model::from_graph(g).unwrap_or_else(|e| panic!("{name}: {e}"));
        let inputs = common::fixture_inputs(&model);
        let want = model
            .run(&inputs, &kiln::RunOptions { backend: Backend::Interp, threads: 1, ..Default::default() })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for threads in [1, 2] {
            let compiled = model
                .compile(&CompileOptions { threads, ..CompileOptions::default() })
                .unwrap_or_else(|e| panic!("{name}: compile: {e}"));
            let got = compiled.run(&inputs).unwrap_or_else(|e| panic!("{name}: run: {e}"));
            common::assert_outputs(&format!("{name} ({threads} threads)"), &got, &want, 1e-4, 1e-5 * scale_of(&want));
        }
    }
}

#[test]
fn reference_models_match_onnx_runtime_on_the_cpu() {
    common::check_reference_models(Backend::Cpu);
}

/// `y = relu(x) * w + b` over a [2, 5] input.
fn small_model() -> Model {
    let text = r#"graph "small" {
  %0 = input {name="x"} : f32[2,5]
  %1 = constant {value=f32[5] [1.0, -2.0, 0.5, 3.0, -1.0]} : f32[5]
  %2 = relu %0 : f32[2,5]
  %3 = broadcast %1 {shape=[2,5]} : f32[2,5]
  %4 = mul %2, %3 : f32[2,5]
  %5 = exp %0 : f32[2,5]
  %6 = add %4, %5 : f32[2,5]
  output "y" = %6
}
"#;
    Model::from_graph(kiln_ir::parse(text).expect("parses")).expect("verifies")
}

#[test]
fn bad_inputs_are_clear_errors() {
    let compiled = small_model().compile(&CompileOptions::default()).unwrap();
    let ok = Tensor::from_vec(vec![2, 5], vec![0.5f32; 10]).unwrap();
    let cases = [
        ("z", ok.clone(), "no input `z`"),
        ("x", Tensor::from_vec(vec![2, 5], vec![1i64; 10]).unwrap(), "should be f32"),
        ("x", Tensor::from_vec(vec![5, 2], vec![0.5f32; 10]).unwrap(), "should have shape"),
        ("x", Tensor::from_vec(vec![10], vec![0.5f32; 10]).unwrap(), "should have shape"),
    ];
    for (name, t, want) in cases {
        let inputs = BTreeMap::from([(name.to_string(), t)]);
        let e = compiled.run(&inputs).expect_err("a bad input fails").to_string();
        assert!(e.contains(want), "{name}: `{e}` should say {want}");
    }
    let e = compiled.run(&BTreeMap::new()).expect_err("a missing input fails").to_string();
    assert!(e.contains("`x` is missing"), "{e}");
}

#[test]
fn nan_and_inf_propagate_as_in_the_interpreter() {
    let model = small_model();
    let x = Tensor::from_vec(
        vec![2, 5],
        vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e30, -1e30, 2.0, f32::NAN, 88.0],
    )
    .unwrap();
    let inputs = BTreeMap::from([("x".to_string(), x)]);
    let want =
        model.run(&inputs, &kiln::RunOptions { backend: Backend::Interp, threads: 1, ..Default::default() }).unwrap();
    let got = model.compile(&CompileOptions::default()).unwrap().run(&inputs).unwrap();
    assert_close("nan/inf", &got, &want);
    let y = got[0].1.as_slice::<f32>().unwrap();
    assert!(y[0].is_nan() && y[8].is_nan(), "NaN propagates: {y:?}");
    assert_eq!(y[5], f32::INFINITY, "{y:?}");
}

#[test]
fn one_compiled_model_runs_from_several_threads() {
    let model = small_model();
    let compiled = model.compile(&CompileOptions { threads: 2, ..CompileOptions::default() }).unwrap();
    let results: Vec<Vec<(String, Tensor)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u64)
            .map(|seed| {
                let compiled = &compiled;
                let model = &model;
                s.spawn(move || {
                    let inputs = model.random_inputs(&BTreeMap::new(), seed).unwrap();
                    let mut last = Vec::new();
                    for _ in 0..20 {
                        last = compiled.run(&inputs).unwrap();
                    }
                    let want = model
                        .run(&inputs, &kiln::RunOptions { backend: Backend::Interp, threads: 1, ..Default::default() })
                        .unwrap();
                    assert_close(&format!("thread {seed}"), &last, &want);
                    last
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results.len(), 4);
    assert!(results[0][0].1.dtype() == DType::F32);
}

/// The library's fallback report and policy: `Compiled::fallbacks` lists every node the interpreter runs, with
/// why; `FallbackPolicy::Deny` refuses the model with `Error::Fallback` naming them; a model with none compiles
/// under `Deny`.
#[test]
fn fallbacks_are_reported_and_deny_refuses_them() {
    // One node the backends do not compile yet: a scatter.
    let text = "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[4,8]\n  \
                %1 = constant {value=i64[1,8] [0, 1, 2, 3, 0, 1, 2, 3]} : i64[1,8]\n  \
                %2 = constant {value=f32[1,8] [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]} : f32[1,8]\n  \
                %3 = scatter %0, %1, %2 {axis=0, reduction=add} : f32[4,8]\n  output \"v\" = %3\n}\n";
    let model = Model::from_graph(kiln::ir::parse(text).unwrap()).unwrap();
    let compiled = model.compile(&CompileOptions::default()).unwrap();
    let f = compiled.fallbacks();
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(f[0].why.contains(&format!("does not compile `{}` yet", f[0].op)), "{}", f[0].why);
    let kinds = kiln::fallback_kinds(f);
    assert_eq!(kinds.iter().map(|k| (k.0, k.1)).collect::<Vec<_>>(), vec![("scatter", 1)]);
    let deny = CompileOptions { fallback: kiln::FallbackPolicy::Deny, ..Default::default() };
    match model.compile(&deny) {
        Err(kiln::Error::Fallback(list)) => assert_eq!(list, f),
        other => panic!("expected a fallback error, got {other:?}"),
    }
    let inputs = common::fixture_inputs(&model);
    let run = kiln::RunOptions { backend: Backend::Cpu, fallback: kiln::FallbackPolicy::Deny, ..Default::default() };
    assert!(matches!(model.run(&inputs, &run), Err(kiln::Error::Fallback(_))));

    // LSTM and GRU run as the library's recurrent routines: nothing falls back, and the outputs are the
    // interpreter's.
    for name in ["mlp_params", "lstm_gru"] {
        let (_, mut g) = common::fixtures().into_iter().find(|(n, _)| n == name).expect("fixture");
        common::bind_weights(&mut g);
        let model = Model::from_graph(g).unwrap();
        let compiled = model.compile(&deny).expect("nothing falls back");
        assert!(compiled.fallbacks().is_empty());
        let inputs = common::fixture_inputs(&model);
        let want = model
            .run(&inputs, &kiln::RunOptions { backend: Backend::Interp, threads: 1, ..Default::default() })
            .unwrap();
        assert_close(name, &compiled.run(&inputs).unwrap(), &want);
    }
}

/// One weight shared by a 3×3 stride-1 conv (Winograd computes it: 24 channels are wide enough,
/// `library::winograd_pays`) and a 3×3 stride-2 conv (it does not) — as
/// deduplicated constant weights are in real models: each conv runs with its own algorithm and matches the
/// interpreter (the stride-2 conv once failed, handed the Winograd-transformed weights).
#[test]
fn a_weight_shared_by_winograd_and_direct_convs_serves_both() {
    let text = r#"graph "shared_weight" {
  %0 = input {name="x"} : f32[1,24,20,20]
  %1 = param {name="w"} : f32[24,24,3,3]
  %2 = conv %0, %1 {strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], groups=1} : f32[1,24,20,20]
  %3 = conv %0, %1 {strides=[2, 2], pads=[1, 1, 1, 1], dilations=[1, 1], groups=1} : f32[1,24,10,10]
  output "same" = %2
  output "strided" = %3
}
"#;
    let mut g = kiln_ir::parse(text).unwrap();
    common::bind_weights(&mut g);
    let model = Model::from_graph(g).unwrap();
    let inputs = common::fixture_inputs(&model);
    let want = model.run(&inputs, &kiln::RunOptions { backend: Backend::Interp, ..Default::default() }).unwrap();
    let got = model.compile(&CompileOptions::default()).unwrap().run(&inputs).unwrap();
    assert_close("shared_weight", &got, &want);
}

/// A concat and a pad along symbolic extents are compiled, and stay correct when an operand is empty at run time
/// (a key/value cache's past of length 0): the empty operand's clamped read lands on the element every buffer
/// has, and is never selected. Checked on the CPU and the emulated CUDA device against the interpreter.
#[test]
fn concat_and_pad_on_symbolic_extents_handle_empty_operands() {
    let text = r#"graph "cache" {
  %0 = input {name="past"} : f32[2,P,3]
  %1 = input {name="new"} : f32[2,S,3]
  %2 = concat %0, %1 {axis=1} : f32[2,P+S,3]
  %3 = pad %0 {mode=constant, pads=[0, 1, 0, 0, 2, 0], value=-1.0} : f32[2,P+3,3]
  output "total" = %2
  output "padded" = %3
}
"#;
    let model = Model::from_graph(kiln_ir::parse(text).unwrap()).unwrap();
    let compiled =
        model.compile(&CompileOptions { fallback: kiln::FallbackPolicy::Deny, ..Default::default() }).unwrap();
    for (p, s) in [(0usize, 4usize), (5, 1), (3, 0)] {
        let past = Tensor::from_vec(vec![2, p, 3], (0..2 * p * 3).map(|v| v as f32).collect::<Vec<_>>()).unwrap();
        let new =
            Tensor::from_vec(vec![2, s, 3], (0..2 * s * 3).map(|v| 100.0 + v as f32).collect::<Vec<_>>()).unwrap();
        let inputs: BTreeMap<String, Tensor> = [("past".to_string(), past), ("new".to_string(), new)].into();
        let want = model.run(&inputs, &kiln::RunOptions { backend: Backend::Interp, ..Default::default() }).unwrap();
        assert_close(&format!("P={p} S={s} (cpu)"), &compiled.run(&inputs).unwrap(), &want);
        let emulated = kiln::RunOptions {
            backend: Backend::CudaEmulated,
            fallback: kiln::FallbackPolicy::Deny,
            ..Default::default()
        };
        assert_close(&format!("P={p} S={s} (cuda-emulated)"), &model.run(&inputs, &emulated).unwrap(), &want);
    }
}

/// Nearest resize is compiled for integer scales and their inverses, in every nearest mode with the asymmetric
/// and half-pixel coordinate modes, and for any scale and coordinate mode on static extents (a table of the
/// interpreter's indices), and matches the interpreter exactly (on the CPU and the emulated device); a symbolic
/// extent at another scale still runs on the interpreter, reported.
#[test]
fn nearest_resize_is_compiled_and_exact() {
    let mut cases = 0;
    for (coord, nearest) in [
        ("asymmetric", "floor"),
        ("asymmetric", "ceil"),
        ("asymmetric", "round_prefer_floor"),
        ("half_pixel", "round_prefer_floor"),
        ("half_pixel", "round_prefer_ceil"),
        ("half_pixel", "floor"),
        ("half_pixel", "ceil"),
        ("align_corners", "round_prefer_floor"),
        ("pytorch_half_pixel", "round_prefer_ceil"),
        ("half_pixel_symmetric", "floor"),
    ] {
        for (scale, out) in [(2.0, 10), (3.0, 15), (0.5, 2), (1.5, 7), (0.6, 3)] {
            let text = format!(
                "graph \"r\" {{\n  %0 = input {{name=\"x\"}} : f32[1,2,5,5]\n  %1 = resize %0 {{mode=nearest, coord={coord}, \
                 nearest={nearest}, shape=[1,2,{out},{out}], scales=[1.0, 1.0, {scale:?}, {scale:?}]}} : f32[1,2,{out},{out}]\n  \
                 output \"y\" = %1\n}}\n"
            );
            let model = Model::from_graph(kiln_ir::parse(&text).unwrap()).unwrap();
            let inputs = common::fixture_inputs(&model);
            let want =
                model.run(&inputs, &kiln::RunOptions { backend: Backend::Interp, ..Default::default() }).unwrap();
            let deny = CompileOptions { fallback: kiln::FallbackPolicy::Deny, ..Default::default() };
            let got = model
                .compile(&deny)
                .unwrap_or_else(|e| panic!("{coord}/{nearest} ×{scale}: {e}"))
                .run(&inputs)
                .unwrap();
            let what = format!("{coord}/{nearest} ×{scale}");
            common::assert_outputs(&what, &got, &want, 0.0, 0.0);
            let emulated = kiln::RunOptions {
                backend: Backend::CudaEmulated,
                fallback: kiln::FallbackPolicy::Deny,
                ..Default::default()
            };
            common::assert_outputs(&what, &model.run(&inputs, &emulated).unwrap(), &want, 0.0, 0.0);
            cases += 1;
        }
    }
    assert_eq!(cases, 50);
    // A nearest resize by 1.5 of a symbolic extent is not compiled yet: it runs on the interpreter, and says why.
    let text = "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[1,1,h,2]\n  \
                %1 = resize %0 {mode=nearest, coord=half_pixel, nearest=round_prefer_floor, shape=[1,1,(3*h)/2,2], \
                scales=[1.0, 1.0, 1.5, 1.0]} : f32[1,1,(3*h)/2,2]\n  output \"v\" = %1\n}\n";
    let compiled = Model::from_graph(kiln::ir::parse(text).unwrap()).unwrap().compile(&CompileOptions::default());
    let f = compiled.unwrap().fallbacks().to_vec();
    assert!(f.len() == 1 && f[0].why.contains("scale 1.5"), "{f:?}");
}

/// Linear resize is compiled (the interpreter's taps as constant tables, its blend order) for every coordinate
/// mode, up and down, one or two resized dims, f32 and f16: the same values as the interpreter, on the CPU and
/// the emulated device, with nothing left on the interpreter.
#[test]
fn linear_resize_is_compiled_and_matches_the_interpreter() {
    let mut cases = 0;
    for coord in ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"] {
        for (out, scales) in
            [("1,2,10,7", "1.0, 1.0, 2.0, 1.75"), ("1,2,3,4", "1.0, 1.0, 0.6, 1.0"), ("1,2,5,1", "1.0, 1.0, 1.0, 0.25")]
        {
            for dtype in ["f32", "f16"] {
                let text = format!(
                    "graph \"g\" {{\n  %0 = input {{name=\"x\"}} : {dtype}[1,2,5,4]\n  \
                     %1 = resize %0 {{mode=linear, coord={coord}, nearest=round_prefer_floor, shape=[{out}], \
                     scales=[{scales}]}} : {dtype}[{out}]\n  output \"y\" = %1\n}}\n"
                );
                let model = Model::from_graph(kiln::ir::parse(&text).unwrap()).unwrap();
                let inputs = common::fixture_inputs(&model);
                let interp = kiln::RunOptions { backend: Backend::Interp, ..Default::default() };
                let want = model.run(&inputs, &interp).unwrap();
                let what = format!("{coord} to [{out}] {dtype}");
                for backend in [Backend::Cpu, Backend::CudaEmulated] {
                    let deny = kiln::RunOptions { backend, fallback: kiln::FallbackPolicy::Deny, ..Default::default() };
                    let got = model.run(&inputs, &deny).unwrap_or_else(|e| panic!("{what}: {e}"));
                    common::assert_outputs(&what, &got, &want, 1e-6, 1e-6);
                }
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 24);
    // On symbolic extents (integer scales and their inverses, half-pixel and asymmetric coordinates): one compiled
    // program serves two shapes.
    let text = "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[1,2,h,w]\n  \
                %1 = resize %0 {mode=linear, coord=half_pixel, nearest=round_prefer_floor, shape=[1,2,2*h,3*w], \
                scales=[1.0, 1.0, 2.0, 3.0]} : f32[1,2,2*h,3*w]\n  \
                %2 = resize %0 {mode=linear, coord=asymmetric, nearest=round_prefer_floor, shape=[1,2,2*h,w], \
                scales=[1.0, 1.0, 2.0, 1.0]} : f32[1,2,2*h,w]\n  output \"up\" = %1\n  output \"tall\" = %2\n}\n";
    let model = Model::from_graph(kiln::ir::parse(text).unwrap()).unwrap();
    let deny = CompileOptions { fallback: kiln::FallbackPolicy::Deny, ..Default::default() };
    let compiled = model.compile(&deny).unwrap();
    for (h, w) in [(3, 5), (8, 2)] {
        let shapes = BTreeMap::from([("x".to_string(), vec![1, 2, h, w])]);
        let inputs = model.random_inputs(&shapes, 7).unwrap();
        let interp = kiln::RunOptions { backend: Backend::Interp, ..Default::default() };
        let want = model.run(&inputs, &interp).unwrap();
        common::assert_outputs(&format!("symbolic {h}x{w}"), &compiled.run(&inputs).unwrap(), &want, 1e-6, 1e-6);
    }
}

/// Cubic resizing (with its coefficient and `exclude_outside`) and antialiased linear and cubic downsampling are
/// compiled from the interpreter's tap tables and match it on the CPU and the emulated device, with fallbacks
/// denied; a downscale whose taps multiply past the kernel's budget is a reported fallback, not a refusal.
#[test]
fn cubic_and_antialiased_resize_are_compiled_and_match_the_interpreter() {
    let mut cases = 0;
    for (mode, extra) in [
        ("cubic", ""),
        ("cubic", ", cubic_a=-0.5, exclude_outside=true"),
        ("linear", ", antialias=true"),
        ("cubic", ", antialias=true"),
    ] {
        for coord in ["half_pixel", "align_corners", "asymmetric"] {
            for (out, scales) in [("1,2,10,7", "1.0, 1.0, 2.0, 1.75"), ("1,2,3,2", "1.0, 1.0, 0.6, 0.5")] {
                for dtype in ["f32", "f16"] {
                    let text = format!(
                        "graph \"g\" {{\n  %0 = input {{name=\"x\"}} : {dtype}[1,2,5,4]\n  \
                         %1 = resize %0 {{mode={mode}, coord={coord}, nearest=round_prefer_floor, shape=[{out}], \
                         scales=[{scales}]{extra}}} : {dtype}[{out}]\n  output \"y\" = %1\n}}\n"
                    );
                    let model = Model::from_graph(kiln::ir::parse(&text).unwrap()).unwrap();
                    let inputs = common::fixture_inputs(&model);
                    let interp = kiln::RunOptions { backend: Backend::Interp, ..Default::default() };
                    let want = model.run(&inputs, &interp).unwrap();
                    let what = format!("{mode}{extra} {coord} to [{out}] {dtype}");
                    for backend in [Backend::Cpu, Backend::CudaEmulated] {
                        let deny =
                            kiln::RunOptions { backend, fallback: kiln::FallbackPolicy::Deny, ..Default::default() };
                        let got = model.run(&inputs, &deny).unwrap_or_else(|e| panic!("{what}: {e}"));
                        common::assert_outputs(&what, &got, &want, 1e-6, 1e-6);
                    }
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 48);
    // A 2-D antialiased cubic downscale by 8 has 32 taps per dim: beyond the budget, it falls back (reported).
    let text = "graph \"g\" {\n  %0 = input {name=\"x\"} : f32[1,1,64,64]\n  \
                %1 = resize %0 {mode=cubic, coord=half_pixel, nearest=round_prefer_floor, shape=[1,1,8,8], \
                scales=[1.0, 1.0, 0.125, 0.125], antialias=true} : f32[1,1,8,8]\n  output \"y\" = %1\n}\n";
    let model = Model::from_graph(kiln::ir::parse(text).unwrap()).unwrap();
    let compiled = model.compile(&CompileOptions::default()).unwrap();
    let [f] = compiled.fallbacks() else { panic!("one fallback: {:?}", compiled.fallbacks()) };
    assert!(f.why.contains("taps per output element"), "{f}");
    let inputs = common::fixture_inputs(&model);
    let want = model.run(&inputs, &kiln::RunOptions { backend: Backend::Interp, ..Default::default() }).unwrap();
    common::assert_outputs("wide antialias", &compiled.run(&inputs).unwrap(), &want, 1e-6, 1e-6);
}

/// `tf_crop_and_resize` coordinates (a crop box partly outside the input, an extrapolation value) compile for
/// nearest, linear and cubic resizing and match the interpreter on the CPU and the emulated device; the crop box
/// reaches outside the input, so some elements are extrapolated, and it crops a dim whose extent stays the same
/// (scale 1: not an identity there).
#[test]
fn crop_and_resize_is_compiled_and_matches_the_interpreter() {
    for mode in ["nearest", "linear", "cubic"] {
        let text = format!(
            "graph \"g\" {{\n  %0 = input {{name=\"x\"}} : f32[1,2,5,4]\n  \
             %1 = resize %0 {{mode={mode}, coord=tf_crop_and_resize, nearest=round_prefer_ceil, shape=[1,2,7,4], \
             scales=[1.0, 1.0, 1.4, 1.0], roi=[0.0, 0.0, 0.2, -0.1, 1.0, 1.0, 0.9, 1.3], extrapolation=-7.5}} \
             : f32[1,2,7,4]\n  output \"y\" = %1\n}}\n"
        );
        let g = kiln::ir::parse(&text).unwrap();
        let printed = kiln::ir::print(&g);
        assert!(printed.contains("roi=[0.0, 0.0, 0.2, -0.1, 1.0, 1.0, 0.9, 1.3], extrapolation=-7.5"), "{printed}");
        assert_eq!(kiln::ir::print(&kiln::ir::parse(&printed).unwrap()), printed, "{mode}: round trip");
        let model = Model::from_graph(g).unwrap();
        let inputs = common::fixture_inputs(&model);
        let want = model.run(&inputs, &kiln::RunOptions { backend: Backend::Interp, ..Default::default() }).unwrap();
        let extrapolated = want[0].1.to_f64_vec().iter().filter(|&&v| v == -7.5).count();
        assert!(extrapolated > 0 && extrapolated < 56, "{mode}: {extrapolated} extrapolated elements");
        for backend in [Backend::Cpu, Backend::CudaEmulated] {
            let deny = kiln::RunOptions { backend, fallback: kiln::FallbackPolicy::Deny, ..Default::default() };
            let got = model.run(&inputs, &deny).unwrap_or_else(|e| panic!("{mode}: {e}"));
            common::assert_outputs(mode, &got, &want, 1e-6, 1e-6);
        }
    }
}

/// The compiled code converts between f16/bf16 and f32 inline, and exactly as the `half` crate (and so the
/// interpreter) does: every f16 to f32; f32 to f16 and to bf16 for every exponent with assorted mantissas
/// (ties, the subnormal range, overflow to infinity, NaNs) — bit for bit, NaNs by class.
#[test]
fn half_precision_conversions_are_exact() {
    let compile = |text: &str| {
        let model = Model::from_graph(kiln_ir::parse(text).unwrap()).unwrap();
        model.compile(&CompileOptions { fallback: kiln::FallbackPolicy::Deny, ..Default::default() }).unwrap()
    };
    let run = |c: &kiln::Compiled, x: Tensor| {
        let inputs: BTreeMap<String, Tensor> = [("x".to_string(), x)].into();
        c.run(&inputs).unwrap().remove(0).1
    };
    // Every f16 bit pattern, widened.
    let n = 1 << 16;
    let widen = compile(&format!(
        "graph \"g\" {{\n  %0 = input {{name=\"x\"}} : f16[{n}]\n  %1 = cast %0 {{to=f32}} : f32[{n}]\n  output \"y\" = %1\n}}\n"
    ));
    let all: Vec<half::f16> = (0..n as u32).map(|b| half::f16::from_bits(b as u16)).collect();
    let got = run(&widen, Tensor::from_vec(vec![n], all.clone()).unwrap());
    for (h, g) in all.iter().zip(got.as_slice::<f32>().unwrap()) {
        let want = h.to_f32();
        assert!(
            g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
            "f16 {:#06x}: {g} vs {want}",
            h.to_bits()
        );
    }
    // f32 patterns: every exponent, with mantissas at and around the rounding boundaries of both targets.
    let mut patterns = Vec::new();
    for exp in 0u32..256 {
        for m in [
            0u32, 1, 0xfff, 0x1000, 0x1001, 0x2000, 0x3000, 0x7fff, 0x8000, 0x8001, 0x18000, 0x7f_e000, 0x7f_f000,
            0x7f_ffff, 0x12_3456,
        ] {
            for sign in [0u32, 1 << 31] {
                patterns.push(f32::from_bits(sign | exp << 23 | m));
            }
        }
    }
    let len = patterns.len();
    for (dtype, to_bits) in [
        ("f16", (|x: f32| half::f16::from_f32(x).to_f32()) as fn(f32) -> f32),
        ("bf16", |x: f32| half::bf16::from_f32(x).to_f32()),
    ] {
        let narrow = compile(&format!(
            "graph \"g\" {{\n  %0 = input {{name=\"x\"}} : f32[{len}]\n  %1 = cast %0 {{to={dtype}}} : {dtype}[{len}]\n  \
             %2 = cast %1 {{to=f32}} : f32[{len}]\n  output \"y\" = %2\n  output \"h\" = %1\n}}\n"
        ));
        // `y` rounds inside one fused kernel; `h` is stored as the half type and read back here.
        let inputs: BTreeMap<String, Tensor> =
            [("x".to_string(), Tensor::from_vec(vec![len], patterns.clone()).unwrap())].into();
        let outs = narrow.run(&inputs).unwrap();
        let (y, h) = (&outs[0].1, &outs[1].1);
        let stored = h.to_f64_vec();
        for ((x, g), s) in patterns.iter().zip(y.as_slice::<f32>().unwrap()).zip(&stored) {
            let want = to_bits(*x);
            for (how, g) in [("rounded", *g), ("stored", *s as f32)] {
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "{dtype} of {x:e} ({:#010x}), {how}: {g:e} vs {want:e}",
                    x.to_bits()
                );
            }
        }
    }
}

/// Max and min reductions fold four lanes at a time into vector partial results: identical to the interpreter's
/// in-order fold, NaN anywhere in the row, signed zeros, rows of every length modulo four.
#[test]
fn vector_max_and_min_reductions_match_the_interpreter_bit_for_bit() {
    for n in [1usize, 3, 4, 5, 8, 13, 64, 67] {
        let text = format!(
            "graph \"g\" {{\n  %0 = input {{name=\"x\"}} : f32[3,{n}]\n  \
             %1 = reduce %0 {{kind=max, axes=[1], keep_dims=false}} : f32[3]\n  \
             %2 = reduce %0 {{kind=min, axes=[1], keep_dims=false}} : f32[3]\n  \
             %3 = reduce %0 {{kind=max, axes=[0, 1], keep_dims=false}} : f32[]\n  \
             output \"max\" = %1\n  output \"min\" = %2\n  output \"all\" = %3\n}}\n"
        );
        let model = Model::from_graph(kiln_ir::parse(&text).unwrap()).unwrap();
        let mut v: Vec<f32> = (0..3 * n).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.25).collect();
        // Row 0: plain; row 1: a NaN at the end; row 2: signed zeros only, with a NaN in its middle lane.
        v[2 * n - 1] = f32::NAN;
        for x in &mut v[2 * n..] {
            *x = if x.is_sign_negative() { -0.0 } else { 0.0 };
        }
        v[2 * n + n / 2] = if n > 2 { f32::NAN } else { 0.0 };
        let inputs = BTreeMap::from([("x".to_string(), Tensor::from_vec(vec![3, n], v).unwrap())]);
        let want = model
            .run(&inputs, &kiln::RunOptions { backend: Backend::Interp, threads: 1, ..Default::default() })
            .unwrap();
        let got = model.compile(&CompileOptions::default()).unwrap().run(&inputs).unwrap();
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            // Bit for bit, signed zeros included; any NaN is a NaN (its payload is the hardware's).
            let bits = |t: &Tensor| {
                t.as_slice::<f32>()
                    .unwrap()
                    .iter()
                    .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(g), bits(w), "{name} over rows of {n}: {g:?} vs {w:?}");
        }
    }
}

/// `if` and `loop` bodies are compiled programs (nested to any depth), not interpreter steps: the control-flow
/// fixtures compile with fallbacks denied, one program serves two batch sizes and matches the interpreter at
/// both (JIT and from its artifact), and a loop that runs past the iteration cap is an error. The emulated
/// device, which has no compiled regions, reports them as host fallbacks (refused when denied).
#[test]
fn region_bodies_are_compiled_programs() {
    let deny = CompileOptions { fallback: kiln::FallbackPolicy::Deny, ..Default::default() };
    let interp = kiln::RunOptions { backend: Backend::Interp, threads: 1, ..Default::default() };
    for name in ["control_flow", "nested_regions"] {
        let (_, g) = common::fixtures().into_iter().find(|(n, _)| n == name).expect("fixture");
        let model = Model::from_graph(g).unwrap();
        let lowered = model.lower(&deny).unwrap_or_else(|e| panic!("{name}: {e}"));
        let exe = &lowered.executable;
        assert!(exe.fallbacks.is_empty(), "{name}: {:?}", exe.fallbacks);
        assert!(exe.steps.iter().any(|s| matches!(s, kiln_codegen::exec::Step::Region { .. })), "{name}: no region");
        assert!(!exe.regions.is_empty(), "{name}: no compiled bodies");
        let compiled = model.compile(&CompileOptions { threads: 2, ..deny.clone() }).unwrap();
        for batch in [2, 5] {
            let shapes: BTreeMap<String, Vec<usize>> = model
                .inputs()
                .into_iter()
                .map(|(n, t)| (n, t.shape.dims().iter().map(|d| d.as_static().unwrap_or(batch) as usize).collect()))
                .collect();
            let inputs = model.random_inputs(&shapes, 11).unwrap();
            let want = model.run(&inputs, &interp).unwrap();
            assert_close(&format!("{name} batch {batch}"), &compiled.run(&inputs).unwrap(), &want);
        }
        let run = kiln::RunOptions {
            backend: Backend::CudaEmulated,
            fallback: kiln::FallbackPolicy::Deny,
            ..Default::default()
        };
        match model.run(&common::fixture_inputs(&model), &run) {
            Err(kiln::Error::Fallback(list)) => {
                assert!(list.iter().all(|f| f.op == "if" || f.op == "loop"), "{name}: {list:?}")
            }
            other => panic!("{name}: the emulated device should refuse its host regions, got {other:?}"),
        }
    }
    // A loop whose trip count and condition never stop it ends at the cap, as on the interpreter.
    let text = r#"graph "forever" {
  %0 = input {name="x"} : f32[3]
  %1 = constant {value=i64[] [9223372036854775807]} : i64[]
  %2 = constant {value=bool[] [true]} : bool[]
  %3 = loop %1, %2, %0 {body=graph "body" {
    %0 = input {name="p0"} : i64[]
    %1 = input {name="p1"} : bool[]
    %2 = input {name="p2"} : f32[3]
    %3 = exp %2 : f32[3]
    output "o0" = %1
    output "o1" = %3
  }, carried=1, count="n"} : f32[3]
  output "y" = %3
}
"#;
    let model = Model::from_graph(kiln_ir::parse(text).unwrap()).unwrap();
    let compiled = model.compile(&deny).unwrap();
    let inputs = BTreeMap::from([("x".to_string(), Tensor::from_vec(vec![3], vec![0.0f32; 3]).unwrap())]);
    // SAFETY of the test: the variable is read when the loop runs; no other test of this binary sets it.
    unsafe { std::env::set_var("KILN_MAX_LOOP_ITERATIONS", "1000") };
    let e = compiled.run(&inputs).expect_err("the cap stops it").to_string();
    assert!(e.contains("ran 1000 iterations without stopping"), "{e}");
}

/// `dynamic_quantize` (ONNX DynamicQuantizeLinear) is compiled on the CPU (the library routine, split over two
/// workers on a large operand) and in the emulated device plan (its primitive expansion as one kernel), with no
/// interpreter step, and matches the interpreter bit for bit: sizes around the vector width and the parallel
/// split, all-positive, all-negative and all-zero operands, infinities and a NaN.
#[test]
fn dynamic_quantize_is_compiled_and_exact_everywhere() {
    let text = r#"graph "dq" {
  %0 = input {name="x"} : f32[n]
  %1, %2, %3 = dynamic_quantize %0 : u8[n], f32[], u8[]
  output "y" = %1
  output "scale" = %2
  output "zero" = %3
}
"#;
    let model = Model::from_graph(kiln_ir::parse(text).unwrap()).unwrap();
    let deny = kiln::FallbackPolicy::Deny;
    let compiled = model.compile(&CompileOptions { fallback: deny, threads: 2, ..Default::default() }).unwrap();
    let ramp = |n: usize, lo: f32, hi: f32| -> Vec<f32> {
        (0..n).map(|i| lo + (hi - lo) * ((i * 7919) % n.max(1)) as f32 / n.max(1) as f32).collect()
    };
    let mut cases = vec![vec![], vec![0.0; 17], ramp(15, 0.5, 3.0), ramp(33, -4.0, -0.25), ramp(1000, -2.5, 7.0)];
    cases.push(ramp(300_001, -1.0, 3.0));
    let mut special = ramp(70, -3.0, 3.0);
    special[3] = f32::INFINITY;
    cases.push(special.clone());
    special[5] = f32::NAN;
    cases.push(special);
    for xs in cases {
        let n = xs.len();
        let inputs: BTreeMap<String, Tensor> = [("x".to_string(), Tensor::from_vec(vec![n], xs).unwrap())].into();
        let want = model.run(&inputs, &kiln::RunOptions { backend: Backend::Interp, ..Default::default() }).unwrap();
        let same = |what: &str, got: Vec<(String, Tensor)>| {
            for ((name, g), (_, w)) in got.iter().zip(&want) {
                assert_eq!(format!("{:?}", g.data()), format!("{:?}", w.data()), "{what} n={n}: {name}");
            }
        };
        same("cpu", compiled.run(&inputs).unwrap());
        if n <= 1000 {
            let emulated = kiln::RunOptions { backend: Backend::CudaEmulated, fallback: deny, ..Default::default() };
            same("cuda-emulated", model.run(&inputs, &emulated).unwrap());
        }
    }
}
