//! A token session: requests to one token backend that share a prefix cache.
//!
//! [`TokenSession::generate`] looks up the cached state sharing the longest prefix with the prompt, runs the
//! backend from it, and stores the resulting state under the tokens it covers (the prompt and every generated
//! token but the last). The prompt's own prefix needs no state of its own: the cache's trie serves any prefix of
//! a stored state (the backend keeps the shared positions), so a second copy of the prompt's keys and values
//! would only cost budget.
//!
//! The session works with any [`Backend`] with token support; without cache support it runs every request cold.
//!
//! A session's cache can outlive its process: [`TokenSession::checkpoint`] exports every cached state the backend
//! can externalize ([`Backend::export_state`]) and drops — and counts — the ones it cannot;
//! [`TokenSession::restore`] imports them into a new session, skipping (and reporting) any the backend refuses.
//! A state that was dropped or refused simply is not cached: the requests that would have used it start cold.

use std::sync::Arc;

use kiln_ir::Tensor;

use crate::RunError;
use crate::contract::{Backend, BackendState, Counters, Node};
use crate::prefix_cache::{CacheStats, CachedState, PrefixCache, Token};

impl CachedState for BackendState {
    fn bytes(&self) -> u64 {
        BackendState::bytes(self)
    }
}

/// What one request produced.
#[derive(Debug)]
pub struct Generation {
    /// The generated token ids.
    pub ids: Vec<Token>,
    /// The backend's further outputs (for [`crate::state::Decoder`]: the logits each id was picked from).
    pub extra: Vec<Tensor>,
    /// What the request cost and saved.
    pub counters: Counters,
    /// The resulting state, if the backend keeps one (also stored in the cache).
    pub state: Option<BackendState>,
}

/// A session's cache as bytes: what [`TokenSession::checkpoint`] could export.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionCheckpoint {
    /// Each exported state's tokens and bytes, least recently used first.
    pub states: Vec<(Vec<Token>, Vec<u8>)>,
    /// States that were not exported because the backend cannot externalize them.
    pub dropped: usize,
}

/// What [`TokenSession::restore`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// States imported into the cache.
    pub restored: usize,
    /// States the backend refused, with why (their requests start cold).
    pub refused: Vec<String>,
}

/// Requests to one token backend sharing a prefix cache with a byte budget.
pub struct TokenSession {
    backend: Arc<dyn Backend>,
    model: String,
    cache: PrefixCache<BackendState>,
    requests: u64,
}

impl TokenSession {
    /// A session running `model` on `backend`, caching at most `budget` bytes of states. The backend must run
    /// token nodes.
    pub fn new(backend: Arc<dyn Backend>, model: impl Into<String>, budget: u64) -> Result<TokenSession, RunError> {
        let model = model.into();
        if !backend.capabilities().token {
            return Err(RunError::Unsupported {
                node: model,
                reason: format!("the backend cannot run token nodes (it has {})", backend.capabilities()),
            });
        }
        Ok(TokenSession { backend, model, cache: PrefixCache::new(budget), requests: 0 })
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The prefix cache's counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Exports every cached state the backend can externalize; the others are dropped (and counted).
    pub fn checkpoint(&self) -> SessionCheckpoint {
        let mut checkpoint = SessionCheckpoint::default();
        for (tokens, state) in self.cache.entries() {
            match self.backend.export_state(state) {
                Some(bytes) => checkpoint.states.push((tokens.to_vec(), bytes)),
                None => checkpoint.dropped += 1,
            }
        }
        checkpoint
    }

    /// Imports a checkpoint's states into this session's cache. A state the backend refuses (corrupt bytes,
    /// another model, a backend without portable states) or whose token count disagrees with its tokens is
    /// skipped and reported; the requests it would have served start cold.
    pub fn restore(&mut self, checkpoint: &SessionCheckpoint) -> RestoreReport {
        let mut report = RestoreReport::default();
        for (i, (tokens, bytes)) in checkpoint.states.iter().enumerate() {
            match self.backend.import_state(bytes) {
                Ok(state) if state.tokens() == tokens.len() => {
                    self.cache.insert(tokens, state);
                    report.restored += 1;
                }
                Ok(state) => report.refused.push(format!(
                    "state {i}: covers {} tokens but was saved for {}",
                    state.tokens(),
                    tokens.len()
                )),
                Err(e) => report.refused.push(format!("state {i}: {e}")),
            }
        }
        report
    }

    /// Generates up to `max_new_tokens` tokens after `prompt`, resuming from the longest cached prefix.
    pub fn generate(&mut self, prompt: &[Token], max_new_tokens: u32) -> Result<Generation, RunError> {
        self.generate_from(prompt, max_new_tokens, None)
    }

    /// As [`TokenSession::generate`], but resuming from `state` (an imported one, say) when given, instead of
    /// the cache's best match.
    pub fn generate_from(
        &mut self,
        prompt: &[Token],
        max_new_tokens: u32,
        state: Option<&BackendState>,
    ) -> Result<Generation, RunError> {
        self.requests += 1;
        let caching = self.backend.capabilities().cache;
        let lease = match state {
            Some(_) => None,
            None if caching => self.cache.lookup(prompt),
            None => None,
        };
        let prefix = state.or(lease.as_ref().map(|hit| hit.state.as_ref()));
        match (&lease, state) {
            (_, Some(s)) => tracing::info!(tokens = s.tokens(), "prefix cache: resuming from a given state"),
            (Some(hit), None) => {
                tracing::info!(reused = hit.state.tokens(), prompt = prompt.len(), "prefix cache: hit")
            }
            (None, None) if caching => tracing::info!(prompt = prompt.len(), "prefix cache: miss, cold start"),
            (None, None) => tracing::debug!("prefix cache: the backend keeps no states"),
        }
        let node =
            Node::token(format!("request {}", self.requests), self.model.clone(), prefix.is_some(), max_new_tokens);
        let ids = Tensor::from_vec(vec![prompt.len()], prompt.iter().map(|&t| t as i64).collect())
            .expect("a vector of prompt ids");
        // The seed's `remaining_tokens`: the prompt tokens the prefix state does not cover.
        let uncached = prompt.len().saturating_sub(prefix.map_or(0, |s| s.tokens()));
        let result = self.backend.run_with_cache(&node, &[ids], prefix, u32::try_from(uncached).unwrap_or(u32::MAX))?;
        drop(lease);
        let mut outputs = result.outputs.into_iter();
        let ids_tensor = outputs.next().ok_or_else(|| RunError::Backend("the token backend returned no ids".into()))?;
        let ids = ids_tensor
            .to_i64_vec()
            .into_iter()
            .map(|t| Token::try_from(t).map_err(|_| RunError::Backend(format!("the token backend returned id {t}"))))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(s) = &result.state
            && caching
        {
            let covered: Vec<Token> = prompt.iter().chain(&ids).copied().take(s.tokens()).collect();
            if covered.len() != s.tokens() {
                return Err(RunError::Backend(format!(
                    "the resulting state covers {} tokens, more than the prompt and the generated ids ({})",
                    s.tokens(),
                    covered.len()
                )));
            }
            self.cache.insert(&covered, s.clone());
        }
        Ok(Generation { ids, extra: outputs.collect(), counters: result.counters, state: result.state })
    }
}
