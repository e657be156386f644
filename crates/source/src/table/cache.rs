//! Decoded chunks (a Parquet row group's records) kept for the next reads, in one cache for
//! the process: the pieces of a batch, read by several threads, and the batches after it
//! mostly fall in the chunk decoded last, and a chunk costs a decompression and a decode.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};

use super::spares;
use crate::Result;

/// Bytes of decoded records the cache keeps at most unless [`set_limit`] says otherwise (the
/// chunks being read are kept beyond it by their readers): 16 row groups of 64 MiB, a block
/// shuffle's default window.
pub(crate) const CACHE_BYTES: usize = 1 << 30;

/// The variable that sets the cache's bound in bytes instead of `CACHE_BYTES`.
pub const LIMIT_VAR: &str = "PINFEED_CHUNK_CACHE_BYTES";

/// The limit [`set_limit`] set; 0 until then (or after `set_limit(0)`), when [`LIMIT_VAR`] or
/// else [`CACHE_BYTES`] rules, read at each eviction so that a test can shrink it.
static LIMIT: AtomicUsize = AtomicUsize::new(0);

/// (table id, chunk index).
type Key = (u64, usize);

/// A decoded chunk's records, shared by the cache and its readers.
pub(crate) type Chunk = Arc<Records>;

/// A chunk's bytes (the `Vec` `pack` made, not copied into an `Arc<[u8]>`), given back to the
/// [`spares`] when the last reader lets go.
#[derive(Debug)]
pub(crate) struct Records(Vec<u8>);

impl std::ops::Deref for Records {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Records {
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.0));
    }
}

/// Gives a buffer no longer used back to the [`spares`].
pub(crate) fn give_back(buf: Vec<u8>) {
    spares::give(buf, limit());
}

#[derive(Default)]
struct Slot {
    /// The records, once decoded; its lock is held while one thread decodes, so the others
    /// asking for the chunk wait for that decode instead of doing their own.
    data: Mutex<Option<Chunk>>,
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
pub(crate) fn get(id: u64, chunk: usize, load: impl FnOnce() -> Result<Vec<u8>>) -> Result<Chunk> {
    let key = (id, chunk);
    let slot = {
        let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
        c.clock += 1;
        let clock = c.clock;
        let slot = c.slots.entry(key).or_default().clone();
        slot.used.store(clock, Ordering::Relaxed);
        slot
    };
    let data = slot.data.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = &*data {
        return Ok(d.clone());
    }
    fill(key, &slot, data, load)
}

/// Whether chunk `chunk` of table `id` is being decoded by another thread now.
pub(crate) fn decoding(id: u64, chunk: usize) -> bool {
    let c = cache().lock().unwrap_or_else(|e| e.into_inner());
    c.slots
        .get(&(id, chunk))
        .is_some_and(|s| matches!(s.data.try_lock(), Err(TryLockError::WouldBlock)))
}

/// Whether chunk `chunk` of table `id` is decoded or being decoded.
pub(crate) fn asked(id: u64, chunk: usize) -> bool {
    let c = cache().lock().unwrap_or_else(|e| e.into_inner());
    c.slots.contains_key(&(id, chunk))
}

/// Decodes chunk `chunk` of table `id` with `load` and keeps it, unless a thread has asked
/// for it already; a failure is not kept (the reader that needs the chunk meets it again).
pub(crate) fn load_ahead(id: u64, chunk: usize, load: impl FnOnce() -> Result<Vec<u8>>) {
    let key = (id, chunk);
    let slot = {
        let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
        if c.slots.contains_key(&key) {
            return;
        }
        c.clock += 1;
        let clock = c.clock;
        let slot = c.slots.entry(key).or_default().clone();
        slot.used.store(clock, Ordering::Relaxed);
        slot
    };
    // Another thread may have found the new slot and locked it first: that one decodes.
    let Ok(data) = slot.data.try_lock() else {
        return;
    };
    let _ = fill(key, &slot, data, load);
}

/// Fills `slot` (locked as `data`, empty) with what `load` returns, and counts its bytes;
/// a failure removes the slot.
fn fill(
    key: Key,
    slot: &Arc<Slot>,
    mut data: MutexGuard<'_, Option<Chunk>>,
    load: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<Chunk> {
    let loaded: Chunk = match load() {
        Ok(v) => Arc::new(Records(v)),
        Err(e) => {
            drop(data);
            let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
            if c.slots.get(&key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
                c.slots.remove(&key);
            }
            return Err(e);
        }
    };
    *data = Some(loaded.clone());
    drop(data);
    // Sizes are set and summed under the cache's lock only, so evictions subtract what was added.
    let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
    if c.slots.get(&key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
        slot.bytes.store(loaded.0.capacity(), Ordering::Relaxed);
        c.bytes += loaded.0.capacity();
    }
    evict(&mut c, key);
    Ok(loaded)
}

/// The bytes of decoded records the cache keeps at most.
pub(crate) fn limit() -> usize {
    match LIMIT.load(Ordering::Relaxed) {
        0 => std::env::var(LIMIT_VAR)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(CACHE_BYTES),
        set => set,
    }
}

/// Sets the cache's limit to `bytes` (0: back to [`LIMIT_VAR`] or [`CACHE_BYTES`]), lets go of
/// chunks down to it, and returns the setting it had (0 when none was set), so that setting
/// that back restores the rule that held.
pub(crate) fn set_limit(bytes: usize) -> usize {
    let old = LIMIT.swap(bytes, Ordering::Relaxed);
    let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
    evict(&mut c, (u64::MAX, usize::MAX));
    old
}

/// Lets go of the least recently asked-for chunks (not `keep`) until the cache holds at most
/// its [`limit`].
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
    spares::trim(limit);
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
