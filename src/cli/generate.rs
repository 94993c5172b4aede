//! `kiln generate`: greedy generation with a decoder step model, a prefix cache, and states saved to and resumed
//! from files.
//!
//! Output (stdout): per request, `ids: a,b,c` then one `name: value` line per counter, requests separated by a
//! blank line. Compile and cache statistics go to stderr, as do warnings (a `--state-in` file that cannot be
//! used: the request then starts cold).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use kiln::generate::{GenerateOptions, Generated, Generator, StepShapes};
use kiln_runtime::prefix_cache::Token;

/// Arguments of `kiln generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// The decoder step model: a folder holding `model.onnx` (such as `gpt2_small_step`), or the `.onnx` file.
    model: PathBuf,
    /// The prompt's token ids, comma-separated.
    #[arg(long, value_name = "ID,ID,…", value_delimiter = ',', required = true)]
    prompt_ids: Vec<Token>,
    /// Further requests after the first, in the same process and cache (repeatable): each a comma-separated
    /// prompt; shows in-process prefix reuse.
    #[arg(long, value_name = "ID,ID,…")]
    then_prompt_ids: Vec<String>,
    /// Tokens to generate per request.
    #[arg(long, default_value_t = 16)]
    max_new_tokens: u32,
    /// Bytes of key/value states the prefix cache keeps.
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20)]
    cache_budget: u64,
    /// Resume the first request from a state file written by `--state-out` (a file that cannot be used gets a
    /// warning and a cold start).
    #[arg(long, value_name = "FILE")]
    state_in: Option<PathBuf>,
    /// Write the last request's resulting state (its prompt and all but the last generated token) to FILE.
    #[arg(long, value_name = "FILE")]
    state_out: Option<PathBuf>,
    /// Compiled step programs kept in memory.
    #[arg(long, default_value_t = 8)]
    max_programs: usize,
    /// Compile a step program for every exact (past, new) shape, instead of padding both to powers of two
    /// (slower: one compile per generated token).
    #[arg(long)]
    exact_shapes: bool,
    /// Worker threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

fn parse_ids(s: &str) -> Result<Vec<Token>> {
    s.split(',').map(|t| t.trim().parse::<Token>().with_context(|| format!("bad token id `{t}` in `{s}`"))).collect()
}

fn print(g: &Generated) {
    let ids: Vec<String> = g.ids.iter().map(|t| t.to_string()).collect();
    let c = g.counters;
    println!("ids: {}", ids.join(","));
    println!("reused_prefix_len: {}", c.reused_prefix_len);
    println!("compute_steps: {}", c.compute_steps);
    println!("tokens_sent: {}", c.tokens_sent);
    println!("tokens_saved: {}", c.tokens_saved);
    println!("used_cached_state: {}", c.used_cached_state);
}

pub fn run(a: GenerateArgs) -> Result<()> {
    let mut prompts = vec![a.prompt_ids.clone()];
    for p in &a.then_prompt_ids {
        prompts.push(parse_ids(p)?);
    }
    if prompts.iter().any(|p| p.is_empty()) {
        bail!("a prompt needs at least one token id");
    }
    let options = GenerateOptions {
        compile: kiln::CompileOptions { threads: a.threads, backends: super::registry()?, ..Default::default() },
        max_programs: a.max_programs,
        cache_budget: a.cache_budget,
        step_shapes: if a.exact_shapes { StepShapes::Exact } else { StepShapes::PowerOfTwo },
    };
    let mut generator = Generator::open(&a.model, &options)?;
    let imported = match &a.state_in {
        None => None,
        Some(path) => {
            let loaded = kiln_ir::io::read_file(path)
                .map_err(|e| e.to_string())
                .and_then(|bytes| generator.import_state(&bytes).map_err(|e| e.to_string()));
            match loaded {
                Ok(state) => {
                    eprintln!("resuming from {} ({} tokens)", path.display(), state.tokens());
                    Some(state)
                }
                Err(e) => {
                    eprintln!("warning: --state-in {}: {e}; starting cold", path.display());
                    None
                }
            }
        }
    };
    let mut last = None;
    for (i, prompt) in prompts.iter().enumerate() {
        if i > 0 {
            println!();
        }
        let g = match (&imported, i) {
            (Some(state), 0) => generator.generate_from(prompt, a.max_new_tokens, state)?,
            _ => generator.generate(prompt, a.max_new_tokens)?,
        };
        print(&g);
        last = Some(g);
    }
    if let (Some(path), Some(g)) = (&a.state_out, &last) {
        let bytes = generator.export_state(&g.state)?;
        std::fs::write(path, &bytes).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {} ({} tokens, {} bytes)", path.display(), g.state.tokens(), bytes.len());
    }
    let s = generator.step_stats();
    let c = generator.cache_stats();
    eprintln!(
        "step programs: {} compiled in {:.1} ms ({:.1} ms each, {:.1} ms of it importing), {} reused, {} evicted; \
         steps ran in {:.1} ms",
        s.compiles,
        s.compile_time.as_secs_f64() * 1e3,
        s.compile_time.as_secs_f64() * 1e3 / s.compiles.max(1) as f64,
        s.import_time.as_secs_f64() * 1e3 / s.compiles.max(1) as f64,
        s.reuses,
        s.evicted,
        s.run_time.as_secs_f64() * 1e3
    );
    eprintln!(
        "prefix cache: {} states, {} of {} bytes, {} evicted, {} trie nodes",
        c.entries, c.bytes, c.budget, c.evicted, c.trie_nodes
    );
    Ok(())
}
