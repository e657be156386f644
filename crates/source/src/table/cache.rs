//! Decoded chunks (a Parquet row group's records) kept for the next reads, in one cache for
//! the process: the pieces of a batch, read by several threads, and the batches after it
//! mostly fall in the chunk decoded last, and a chunk costs a decompression and a decode.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::Result;

/// Bytes of decoded records the cache keeps at most (the chunks being read are kept beyond
/// it by their readers): 16 row groups of 64 MiB, a block shuffle's default window.
pub(crate) const CACHE_BYTES: usize = 1 << 30;

/// The variable that sets the cache's bound in bytes instead of [`CACHE_BYTES`].
pub const LIMIT_VAR: &str = "PINFEED_CHUNK_CACHE_BYTES";

/// The cache's bound: [`LIMIT_VAR`] when set, else [`CACHE_BYTES`]; read at each eviction,
/// so a test can shrink it.
fn limit() -> usize {
    std::env::var(LIMIT_VAR)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(CACHE_BYTES)
}

/// (table id, chunk index).
type Key = (u64, usize);

#[derive(Default)]
struct Slot {
    /// The records, once decoded; its lock is held while one thread decodes, so the others
    /// asking for the chunk wait for that decode instead of doing their own.
    data: Mutex<Option<Arc<[u8]>>>,
    /// When it was last asked for (the cache's clock).
    used: AtomicU64,
    /// Its bytes once decoded; 0 before.
    bytes: AtomicUsize,
}

#[derive(Default)]
struct Cache {
    slots: HashMap<Key, Arc<Slot>>,
    clock: u64,
    bytes: usize,
}

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// A fresh id for a table's chunks.
pub(crate) fn new_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Chunk `chunk` of table `id`, from the cache or from `load` (whose failure is returned and
/// not kept).
pub(crate) fn get(
    id: u64,
    chunk: usize,
    load: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<Arc<[u8]>> {
    let key = (id, chunk);
    let slot = {
        let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
        c.clock += 1;
        let clock = c.clock;
        let slot = c.slots.entry(key).or_default().clone();
        slot.used.store(clock, Ordering::Relaxed);
        slot
    };
    let mut data = slot.data.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = &*data {
        return Ok(d.clone());
    }
    let loaded: Arc<[u8]> = match load() {
        Ok(v) => v.into(),
        Err(e) => {
            drop(data);
            let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
            if c.slots.get(&key).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                c.slots.remove(&key);
            }
            return Err(e);
        }
    };
    *data = Some(loaded.clone());
    drop(data);
    // Sizes are set and summed under the cache's lock only, so evictions subtract what was added.
    let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
    if c.slots.get(&key).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
        slot.bytes.store(loaded.len(), Ordering::Relaxed);
        c.bytes += loaded.len();
    }
    evict(&mut c, key);
    Ok(loaded)
}

/// Lets go of the least recently asked-for chunks (not `keep`) until the cache holds at most
/// [`limit`].
fn evict(c: &mut Cache, keep: Key) {
    let limit = limit();
    while c.bytes > limit {
        let oldest = c
            .slots
            .iter()
            .filter(|(k, s)| **k != keep && s.bytes.load(Ordering::Relaxed) > 0)
            .min_by_key(|(_, s)| s.used.load(Ordering::Relaxed))
            .map(|(k, _)| *k);
        let Some(k) = oldest else { break };
        if let Some(s) = c.slots.remove(&k) {
            c.bytes -= s.bytes.load(Ordering::Relaxed);
        }
    }
}

/// Forgets every chunk of table `id` (the table is dropped).
pub(crate) fn forget(id: u64) {
    let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
    let mut freed = 0;
    c.slots.retain(|k, s| {
        let keep = k.0 != id;
        if !keep {
            freed += s.bytes.load(Ordering::Relaxed);
        }
        keep
    });
    c.bytes -= freed;
}
