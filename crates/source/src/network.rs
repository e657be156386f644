//! What a source read over the network: counters an object-store source keeps and
//! [`Source::network`](crate::Source::network) reports.

use std::time::Duration;

/// Network counters of one source, summed over the threads that read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkStats {
    /// Body bytes received from the store (a retried range counts what each attempt received).
    pub bytes_fetched: u64,
    /// Requests sent: ranged GETs, listings and header reads, retries included.
    pub requests: u64,
    /// Requests sent again after a throttling reply, a server error, a reset or a truncated
    /// body.
    pub retries: u64,
    /// Blocks of the local cache read instead of fetched.
    pub cache_hits: u64,
    /// Blocks fetched because the local cache did not hold them.
    pub cache_misses: u64,
    /// Blocks that could not be written to or read from the local cache (a full disk, a
    /// deleted directory); the data came from the store instead.
    pub cache_errors: u64,
    /// Time reading threads spent on reads from the store (or the cache), summed over threads:
    /// waiting for replies, and reading their bodies from the sockets into the slots.
    pub wait: Duration,
}

impl NetworkStats {
    /// What was counted after `earlier`, a snapshot of the same counters: a loader's pass
    /// reports what it fetched, not what the source fetched before it started.
    pub fn since(&self, earlier: &NetworkStats) -> NetworkStats {
        NetworkStats {
            bytes_fetched: self.bytes_fetched.saturating_sub(earlier.bytes_fetched),
            requests: self.requests.saturating_sub(earlier.requests),
            retries: self.retries.saturating_sub(earlier.retries),
            cache_hits: self.cache_hits.saturating_sub(earlier.cache_hits),
            cache_misses: self.cache_misses.saturating_sub(earlier.cache_misses),
            cache_errors: self.cache_errors.saturating_sub(earlier.cache_errors),
            wait: self.wait.saturating_sub(earlier.wait),
        }
    }

    /// Adds `other`'s counters to these: the network of several loaders side by side.
    pub fn add(&mut self, other: &NetworkStats) {
        self.bytes_fetched += other.bytes_fetched;
        self.requests += other.requests;
        self.retries += other.retries;
        self.cache_hits += other.cache_hits;
        self.cache_misses += other.cache_misses;
        self.cache_errors += other.cache_errors;
        self.wait += other.wait;
    }
}
