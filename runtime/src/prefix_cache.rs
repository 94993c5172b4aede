//! A prefix cache for token states: the first piece of the runtime contracts' stateful execution (issue 6).
//!
//! A *state* is whatever a stateful model carries from one call to the next for a token prefix — for a decoder,
//! the key/value tensors of every position of that prefix. The cache keeps states keyed by their exact token
//! prefix, in a trie over token ids, and answers one question: for a new prompt, which cached state shares the
//! longest prefix with it, and how long is that prefix? A state for tokens `t[..n]` serves any prompt that
//! agrees with it on its first `k ≤ n` tokens (the caller keeps the first `k` positions), so the answer is the
//! deepest trie node on the prompt's path that has any state at or below it.
//!
//! Memory is bounded: every state has a size in bytes, and inserting beyond the budget evicts least recently used
//! states first. A state handed out by [`PrefixCache::lookup`] is leased — an [`Arc`] the caller holds — and a
//! leased state is never evicted (the budget may then be exceeded until the lease ends; [`PrefixCache::stats`]
//! says so). Everything is deterministic: ties go to the most recently used state.
//!
//! Removing a state (evicted or replaced) prunes the trie nodes no other state needs, and their slots are reused,
//! so a long-running server with many distinct prompts holds trie nodes only for the states it keeps. The decoding
//! loop that fills the cache is [`crate::state`].

use std::collections::HashMap;
use std::sync::Arc;

/// A token id.
pub type Token = u32;

/// What the cache needs to know about a state.
pub trait CachedState {
    /// Bytes the state holds (for the budget).
    fn bytes(&self) -> u64;
}

/// One trie node: children by next token, the state stored for exactly this prefix, and how many states lie at
/// or below it.
#[derive(Default)]
struct Node {
    children: HashMap<Token, usize>,
    entry: Option<usize>,
    below: usize,
}

struct Entry<S> {
    tokens: Vec<Token>,
    state: Arc<S>,
    last_used: u64,
    node: usize,
}

/// The result of a lookup: the state to resume from and how many of the prompt's tokens it covers.
pub struct Hit<S> {
    /// The cached state (leased while this `Arc` lives). It was computed for `state_tokens`, of which the first
    /// `reused` equal the prompt's.
    pub state: Arc<S>,
    /// The tokens the state was computed for.
    pub state_tokens: Vec<Token>,
    /// Length of the shared prefix (≥ 1).
    pub reused: usize,
}

/// Counters for reports.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// States held.
    pub entries: usize,
    /// Bytes held.
    pub bytes: u64,
    /// The budget.
    pub budget: u64,
    /// States evicted so far.
    pub evicted: u64,
    /// Live trie nodes, the root included (pruned along with the states that needed them).
    pub trie_nodes: usize,
}

/// A trie of token prefixes holding states, with an LRU byte budget. See the module docs.
pub struct PrefixCache<S> {
    nodes: Vec<Node>,
    /// Slots of pruned nodes, reused before `nodes` grows.
    free: Vec<usize>,
    entries: HashMap<usize, Entry<S>>,
    next_entry: usize,
    clock: u64,
    bytes: u64,
    budget: u64,
    evicted: u64,
}

impl<S: CachedState> PrefixCache<S> {
    /// An empty cache holding at most `budget` bytes of states (leased states excepted).
    pub fn new(budget: u64) -> PrefixCache<S> {
        PrefixCache {
            nodes: vec![Node::default()],
            free: Vec::new(),
            entries: HashMap::new(),
            next_entry: 0,
            clock: 0,
            bytes: 0,
            budget,
            evicted: 0,
        }
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            entries: self.entries.len(),
            bytes: self.bytes,
            budget: self.budget,
            evicted: self.evicted,
            trie_nodes: self.nodes.len() - self.free.len(),
        }
    }

    /// The cached state sharing the longest prefix with `prompt`, most recently used first among equals; `None`
    /// when no state shares even the first token.
    pub fn lookup(&mut self, prompt: &[Token]) -> Option<Hit<S>> {
        let mut node = 0;
        let mut best: Option<(usize, usize)> = None; // (node, depth)
        for (depth, t) in prompt.iter().enumerate() {
            match self.nodes[node].children.get(t) {
                Some(&child) if self.nodes[child].below > 0 => {
                    node = child;
                    best = Some((node, depth + 1));
                }
                _ => break,
            }
        }
        let (node, reused) = best?;
        let id = self.most_recent_below(node)?;
        self.clock += 1;
        let entry = self.entries.get_mut(&id)?;
        entry.last_used = self.clock;
        Some(Hit { state: Arc::clone(&entry.state), state_tokens: entry.tokens.clone(), reused })
    }

    /// Every cached state with the tokens it covers, least recently used first (so re-inserting them in this
    /// order rebuilds the same recency).
    pub fn entries(&self) -> Vec<(&[Token], &Arc<S>)> {
        let mut v: Vec<_> = self.entries.values().collect();
        v.sort_by_key(|e| e.last_used);
        v.into_iter().map(|e| (e.tokens.as_slice(), &e.state)).collect()
    }

    /// Stores `state` for exactly `tokens` (replacing a state stored for the same tokens), then evicts least
    /// recently used unleased states while over budget. A state larger than the whole budget is not stored.
    pub fn insert(&mut self, tokens: &[Token], state: S) {
        let size = state.bytes();
        if tokens.is_empty() || size > self.budget {
            return;
        }
        // Replace first: removing the old state may prune the very path walked below.
        if let Some(old) = self.find(tokens).and_then(|n| self.nodes[n].entry) {
            self.remove(old);
        }
        let mut node = 0;
        for &t in tokens {
            node = match self.nodes[node].children.get(&t) {
                Some(&c) => c,
                None => {
                    let c = match self.free.pop() {
                        Some(slot) => slot,
                        None => {
                            self.nodes.push(Node::default());
                            self.nodes.len() - 1
                        }
                    };
                    self.nodes[node].children.insert(t, c);
                    c
                }
            };
        }
        self.clock += 1;
        let id = self.next_entry;
        self.next_entry += 1;
        self.entries.insert(id, Entry { tokens: tokens.to_vec(), state: Arc::new(state), last_used: self.clock, node });
        self.nodes[node].entry = Some(id);
        self.adjust_below(tokens, 1);
        self.bytes += size;
        self.evict_to_budget(Some(id));
    }

    /// Evicts least recently used states no one leases until the cache fits its budget; `keep` is never evicted.
    fn evict_to_budget(&mut self, keep: Option<usize>) {
        while self.bytes > self.budget {
            let victim = self
                .entries
                .iter()
                .filter(|(id, e)| Some(**id) != keep && Arc::strong_count(&e.state) == 1)
                .min_by_key(|(id, e)| (e.last_used, **id))
                .map(|(id, _)| *id);
            match victim {
                Some(id) => {
                    self.remove(id);
                    self.evicted += 1;
                }
                None => break,
            }
        }
    }

    fn remove(&mut self, id: usize) {
        if let Some(e) = self.entries.remove(&id) {
            self.nodes[e.node].entry = None;
            self.bytes -= e.state.bytes();
            self.adjust_below(&e.tokens, -1);
            self.prune(&e.tokens);
        }
    }

    /// The node for exactly `tokens`, if the trie has one.
    fn find(&self, tokens: &[Token]) -> Option<usize> {
        tokens.iter().try_fold(0, |node, t| self.nodes[node].children.get(t).copied())
    }

    /// Detaches and frees the part of `tokens`' path that no state lies at or below. Every live non-root node
    /// has a state at or below it, so that part is a chain starting at the first such node.
    fn prune(&mut self, tokens: &[Token]) {
        let mut node = 0;
        for t in tokens {
            let Some(&child) = self.nodes[node].children.get(t) else { return };
            if self.nodes[child].below == 0 {
                self.nodes[node].children.remove(t);
                let mut stack = vec![child];
                while let Some(n) = stack.pop() {
                    let dead = std::mem::take(&mut self.nodes[n]);
                    stack.extend(dead.children.into_values());
                    self.free.push(n);
                }
                return;
            }
            node = child;
        }
    }

    /// Adds `delta` to the `below` count of every node on `tokens`' path (the root included).
    fn adjust_below(&mut self, tokens: &[Token], delta: isize) {
        let mut node = 0;
        self.nodes[0].below = self.nodes[0].below.saturating_add_signed(delta);
        for t in tokens {
            let Some(&c) = self.nodes[node].children.get(t) else { return };
            node = c;
            self.nodes[node].below = self.nodes[node].below.saturating_add_signed(delta);
        }
    }

    /// The most recently used entry at or below `node`.
    fn most_recent_below(&self, node: usize) -> Option<usize> {
        let mut best: Option<(u64, usize)> = None;
        let mut stack = vec![node];
        while let Some(n) = stack.pop() {
            let nd = &self.nodes[n];
            if nd.below == 0 {
                continue;
            }
            if let Some(id) = nd.entry
                && let Some(e) = self.entries.get(&id)
                && best.is_none_or(|(t, _)| e.last_used > t)
            {
                best = Some((e.last_used, id));
            }
            stack.extend(nd.children.values().copied());
        }
        best.map(|(_, id)| id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct S(u64, &'static str);
    impl CachedState for S {
        fn bytes(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn the_longest_shared_prefix_wins() {
        let mut c = PrefixCache::new(1000);
        c.insert(&[1, 2, 3, 4], S(10, "a"));
        c.insert(&[1, 2, 9], S(10, "b"));
        let h = c.lookup(&[1, 2, 3, 7, 8]).expect("a hit");
        assert_eq!((h.reused, h.state.1, h.state_tokens.as_slice()), (3, "a", &[1, 2, 3, 4][..]));
        let h = c.lookup(&[1, 2, 9, 9]).expect("a hit");
        assert_eq!((h.reused, h.state.1), (3, "b"));
        // Only the first two tokens shared: the most recently used of the two states.
        let h = c.lookup(&[1, 2, 5]).expect("a hit");
        assert_eq!((h.reused, h.state.1), (2, "b"));
        assert!(c.lookup(&[7]).is_none());
        assert!(c.lookup(&[]).is_none());
    }

    #[test]
    fn least_recently_used_states_go_first_and_leased_ones_stay() {
        let mut c = PrefixCache::new(25);
        c.insert(&[1], S(10, "a"));
        c.insert(&[2], S(10, "b"));
        let lease = c.lookup(&[1]).expect("a hit").state; // "a" is now the most recent, and leased
        c.insert(&[3], S(10, "c")); // over budget: "b" is the least recent unleased state
        assert!(c.lookup(&[2]).is_none());
        assert_eq!(c.stats().evicted, 1);
        c.insert(&[4], S(10, "d")); // "a" is leased, so "c" goes
        assert!(c.lookup(&[3]).is_none());
        assert_eq!(c.lookup(&[1]).expect("leased a stays").state.1, "a");
        drop(lease);
        c.insert(&[5], S(10, "e"));
        assert_eq!(c.stats().entries, 2);
        assert!(c.stats().bytes <= 25);
    }

    #[test]
    fn evicted_states_leave_no_trie_nodes_behind() {
        let mut c = PrefixCache::new(30);
        c.insert(&[1, 2, 3], S(10, "shared"));
        for i in 0..200u32 {
            c.insert(&[1, 2, 3, 100 + i, 7, 7, 7], S(10, "long"));
        }
        // Three states fit: [1,2,3] was used least recently and went first; the three newest long ones remain.
        let stats = c.stats();
        assert_eq!((stats.entries, stats.evicted), (3, 198));
        assert_eq!(stats.trie_nodes, 1 + 3 + 3 * 4, "root, the shared [1,2,3] path, three 4-node tails");
        let h = c.lookup(&[1, 2, 3, 299, 7, 7, 7]).expect("the newest state");
        assert_eq!((h.reused, h.state.1), (7, "long"));
        let h = c.lookup(&[1, 2, 3, 5]).expect("a prefix of the kept states");
        assert_eq!(h.reused, 3);
        drop(h);
        // Replacing a state that alone needed its path keeps the path usable.
        c.insert(&[1, 2, 3, 299, 7, 7, 7], S(10, "again"));
        assert_eq!(c.lookup(&[1, 2, 3, 299, 7, 7, 7]).expect("replaced").state.1, "again");
        assert_eq!(c.stats().trie_nodes, 1 + 3 + 3 * 4);
        // A budget that keeps nothing leaves only the root.
        let mut tiny = PrefixCache::new(10);
        for i in 0..50u32 {
            tiny.insert(&[i, i + 1, i + 2], S(10, "x"));
        }
        assert_eq!((tiny.stats().entries, tiny.stats().trie_nodes), (1, 4));
    }

    #[test]
    fn replacing_and_oversized_states() {
        let mut c = PrefixCache::new(15);
        c.insert(&[1, 2], S(5, "a"));
        c.insert(&[1, 2], S(6, "b"));
        assert_eq!((c.stats().entries, c.stats().bytes), (1, 6));
        assert_eq!(c.lookup(&[1, 2]).expect("hit").state.1, "b");
        c.insert(&[3], S(100, "huge"));
        assert!(c.lookup(&[3]).is_none(), "a state over the whole budget is not stored");
        c.insert(&[], S(1, "empty"));
        assert_eq!(c.stats().entries, 1, "an empty prefix is not stored");
    }
}
