//! Token states: autoregressive decoding with a key/value cache, and keeping its states across requests and
//! processes.
//!
//! - [`kv`]: [`DecoderSpec`] (a decoder step model's input/output names and sizes) and [`KvState`] (the
//!   per-layer key/value tensors of a token prefix, with its tokens and the model's fingerprint).
//! - [`decoder`]: [`Decoder`], the token backend: greedy decoding over a [`StepRunner`] that runs one step of the
//!   model for a (past, new) shape. It knows nothing of compilers; the `kiln` facade supplies a runner backed by
//!   compiled programs.
//! - [`session`]: [`TokenSession`], which keeps result states in a [`crate::prefix_cache::PrefixCache`] and
//!   resumes each request from the longest cached prefix.
//! - [`format`](mod@format): the versioned, checksummed byte format a state is exported to and imported from.
//!
//! `docs/generate.md` describes the decode loop, the counters and the byte layout.

pub mod decoder;
pub mod format;
pub mod kv;
pub mod session;

pub use decoder::{Decoded, Decoder, StepRunner, StepShape, argmax};
pub use kv::{DecoderSpec, KvState};
pub use session::{Generation, RestoreReport, SessionCheckpoint, TokenSession};

#[cfg(test)]
mod tests;
