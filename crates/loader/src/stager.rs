//! Uploads of arbitrary host byte ranges through a fixed pinned arena: what `prefetch` and
//! `to_device` are made of.
//!
//! The arena is one page-locked allocation made at start-up. An upload reserves pieces of it in
//! FIFO order, fills each piece with a multi-threaded `memcpy`, and issues the piece's copy into
//! the destination at once, so the copy of one piece overlaps the `memcpy` of the next. A piece
//! is reused only after its copy's fence has completed. Uploads larger than the arena stream
//! through it; nothing is page-locked per upload.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use pinfeed_cuda::{Context, PinMethod, Registration};

use crate::backend::{Backend, CopyFence, DeviceBudget, DeviceSpec, Landed};
use crate::error::{LoaderError, Result};
use crate::pool::{count_pinned_allocation, PinnedPool};
use crate::{DeviceData, DEFAULT_PINNED_BUDGET};

/// Pieces are aligned to this, so that every `memcpy` and DMA starts on a cache line.
const ALIGN: usize = 4096;

/// How a [`Stager`] runs.
#[derive(Clone, Debug)]
pub struct StagerOptions {
    /// Where uploads go.
    pub device: DeviceSpec,
    /// Bytes of page-locked memory in the arena.
    pub pinned_budget: usize,
    /// Threads that copy into the arena; `None` for one per core, at most 8.
    pub num_threads: Option<usize>,
    /// How the arena is page-locked on CUDA.
    pub pin_method: PinMethod,
    /// Largest piece one copy moves; `None` for a quarter of the arena, at most 64 MiB, so that
    /// several pieces are in flight at once.
    pub piece_bytes: Option<usize>,
}

impl Default for StagerOptions {
    fn default() -> Self {
        StagerOptions {
            device: DeviceSpec::Auto,
            pinned_budget: DEFAULT_PINNED_BUDGET,
            num_threads: None,
            pin_method: PinMethod::Register,
            piece_bytes: None,
        }
    }
}

/// The in-flight pieces of the arena, oldest first, each `[start, end)` with the fence of the
/// copy reading it. Pieces never overlap, and they are laid out in allocation order around the
/// ring: each starts at the previous one's end or, after a wrap, at 0.
#[derive(Default)]
struct Arena {
    pieces: VecDeque<(usize, usize, CopyFence)>,
}

impl Arena {
    /// Where a piece of `len` bytes fits now, if it does.
    fn fit(&self, capacity: usize, len: usize) -> Option<usize> {
        let (Some(&(oldest, _, _)), Some(&(_, head, _))) =
            (self.pieces.front(), self.pieces.back())
        else {
            return Some(0);
        };
        // Pieces have non-zero lengths, so `head == oldest` only when the ring wrapped and is full.
        if head > oldest {
            // Not wrapped: free space is [head, capacity) and [0, oldest).
            if capacity - head >= len {
                return Some(head);
            }
            if oldest >= len {
                return Some(0);
            }
            None
        } else {
            // Wrapped: free space is [head, oldest).
            (oldest - head >= len).then_some(head)
        }
    }
}

struct StagerShared {
    // Field order is drop order: `Drop` waits for every piece before the pool is freed.
    arena: Mutex<Arena>,
    pool: PinnedPool,
    backend: Arc<Backend>,
    budget: Arc<DeviceBudget>,
}

impl Drop for StagerShared {
    fn drop(&mut self) {
        let arena = self.arena.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, _, fence) in arena.pieces.drain(..) {
            let _ = pinfeed_ring::Fence::wait(&fence);
        }
    }
}

/// Copies host byte ranges of any size to the device through a fixed pinned arena.
pub struct Stager {
    shared: Arc<StagerShared>,
    /// Serialises uploads: pieces must be issued in arena order.
    upload: Mutex<()>,
    threads: usize,
    piece: usize,
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("device", &self.device())
            .field("pinned_bytes", &self.pinned_bytes())
            .field("threads", &self.threads)
            .field("piece", &self.piece)
            .finish()
    }
}

impl Stager {
    /// Makes the arena: the one page-locked allocation of this stager.
    pub fn new(options: StagerOptions) -> Result<Stager> {
        let capacity = options.pinned_budget / ALIGN * ALIGN;
        if capacity < 2 * ALIGN {
            return Err(LoaderError::Config(format!(
                "pinned budget of {} bytes is too small for a staging arena: give at least {} bytes",
                options.pinned_budget,
                2 * ALIGN
            )));
        }
        let piece = options
            .piece_bytes
            .unwrap_or((capacity / 4).min(64 << 20))
            .clamp(ALIGN, capacity / 2)
            / ALIGN
            * ALIGN;
        let threads = options
            .num_threads
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map_or(4, |n| n.get())
                    .min(8)
            })
            .max(1);
        let backend = Arc::new(Backend::new(options.device, options.pin_method)?);
        let pool = backend.pinned_pool(capacity, 1)?;
        Ok(Stager {
            shared: Arc::new(StagerShared {
                arena: Mutex::new(Arena::default()),
                pool,
                backend,
                budget: DeviceBudget::new(None),
            }),
            upload: Mutex::new(()),
            threads,
            piece,
        })
    }

    /// Where uploads go.
    pub fn device(&self) -> DeviceSpec {
        self.shared.backend.device()
    }

    /// Bytes of page-locked memory in the arena.
    pub fn pinned_bytes(&self) -> usize {
        self.shared.pool.bytes()
    }

    /// Whether the arena is really page-locked (see [`Stats::pinned_locked`](crate::Stats)).
    pub fn pinned_locked(&self) -> bool {
        self.shared.pool.locked()
    }

    /// Reserves `len` bytes of the arena, waiting for the oldest copies to finish as needed.
    fn reserve(&self, len: usize) -> Result<usize> {
        let capacity = self.shared.pool.slot_bytes();
        debug_assert!(len <= capacity);
        loop {
            let oldest = {
                let mut arena = self.shared.arena.lock().unwrap_or_else(|p| p.into_inner());
                // Drop pieces whose copies have finished, oldest first.
                while let Some((_, _, fence)) = arena.pieces.front() {
                    if !pinfeed_ring::Fence::is_complete(fence)? {
                        break;
                    }
                    arena.pieces.pop_front();
                }
                if let Some(start) = arena.fit(capacity, len) {
                    return Ok(start);
                }
                arena.pieces.front().map(|(_, _, fence)| fence.clone())
            };
            match oldest {
                Some(fence) => pinfeed_ring::Fence::wait(&fence)?,
                None => unreachable!("an empty arena fits any piece no larger than itself"),
            }
        }
    }

    /// Copies `src` into new device memory. Returns once the last copy is issued; the result's
    /// fence completes when all of it has arrived. Blocks while the arena is full.
    pub fn upload(&self, src: &[u8]) -> Result<DeviceArray> {
        let _one_at_a_time = self.upload.lock().unwrap_or_else(|p| p.into_inner());
        let shared = &self.shared;
        let mut memory = shared.backend.alloc(src.len(), &shared.budget)?;
        let mut last = None;
        let mut offset = 0;
        for piece in src.chunks(self.piece) {
            let len = piece.len();
            let start = self.reserve(len.next_multiple_of(ALIGN))?;
            // SAFETY: `reserve` returned `start .. start + len` free: no copy reads it and no
            // other upload runs (the upload lock).
            let staging = unsafe { shared.pool.bytes_mut(start, len) };
            parallel_copy(staging, piece, self.threads);
            // SAFETY: the staging piece stays reserved (in the arena's list) until this fence
            // completes; the destination range is inside `memory`, which no one reads before
            // the fence.
            let fence = unsafe {
                shared
                    .backend
                    .copy(staging.as_ptr(), &mut memory, offset, len)
            }?;
            shared
                .arena
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pieces
                .push_back((start, start + len.next_multiple_of(ALIGN), fence.clone()));
            last = Some(fence);
            offset += len;
        }
        let ready = match last {
            Some(fence) => fence,
            None => shared.backend.completed_fence()?,
        };
        Ok(DeviceArray {
            len: src.len(),
            landed: Landed {
                ready,
                memory,
                backend: Arc::clone(&shared.backend),
            },
        })
    }
}

/// Copies `src` into `dst` on up to `threads` threads (one for small copies).
fn parallel_copy(dst: &mut [u8], src: &[u8], threads: usize) {
    let dst = &mut dst[..src.len()];
    const MIN_PER_THREAD: usize = 1 << 20;
    let threads = threads.min(src.len() / MIN_PER_THREAD).max(1);
    if threads == 1 {
        dst.copy_from_slice(src);
        return;
    }
    let part = src.len().div_ceil(threads).next_multiple_of(64);
    std::thread::scope(|scope| {
        for (d, s) in dst.chunks_mut(part).zip(src.chunks(part)) {
            scope.spawn(move || d.copy_from_slice(s));
        }
    });
}

/// Host bytes copied to new device memory by a [`Stager`]. It keeps the backend alive, not
/// the arena: a stager waits for its copies before freeing its arena.
pub struct DeviceArray {
    len: usize,
    landed: Landed,
}

impl std::fmt::Debug for DeviceArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceArray")
            .field("len", &self.len)
            .field("device", &self.landed.backend.device())
            .finish()
    }
}

impl DeviceData for DeviceArray {
    fn address(&self) -> u64 {
        self.landed.memory.address()
    }
    fn len_bytes(&self) -> usize {
        self.len
    }
    fn device(&self) -> DeviceSpec {
        self.landed.backend.device()
    }
    fn wait_ready(&self) -> Result<()> {
        self.landed.wait_ready()
    }
    unsafe fn stream_wait(&self, stream: u64) -> Result<()> {
        // SAFETY: forwarded from the trait's contract.
        unsafe { self.landed.stream_wait(stream) }
    }
    unsafe fn release_after(self: Box<Self>, stream: u64) -> Result<()> {
        // SAFETY: forwarded from the trait's contract.
        unsafe { self.landed.order_free_after(stream) }
    }
    fn read_back(&self, dst: &mut [u8]) -> Result<()> {
        self.landed.read_back(dst, self.len)
    }
    fn host_bytes(&self) -> Result<Option<&[u8]>> {
        self.landed.host_bytes(self.len)
    }
}

/// Copies `src` to new device memory through a staging arena made for the purpose, and waits
/// until it has arrived: the seed's one large pageable tensor, moved without pinning it.
pub fn to_device(src: &[u8], options: StagerOptions) -> Result<DeviceArray> {
    let budget = options
        .pinned_budget
        .min(src.len().next_multiple_of(ALIGN).max(2 * ALIGN));
    let stager = Stager::new(StagerOptions {
        pinned_budget: budget,
        ..options
    })?;
    let array = stager.upload(src)?;
    array.wait_ready()?;
    Ok(array)
}

/// Bytes of memory this machine has.
fn mem_total() -> Option<u64> {
    crate::direct::meminfo("MemTotal")
}

/// Existing host memory page-locked in place until dropped: `cuMemHostRegister` on CUDA,
/// `mlock` on the host backend.
pub struct PinnedRegion {
    _lock: RegionLock,
    len: usize,
}

enum RegionLock {
    /// Held for its `Drop`, which unregisters the range.
    Cuda(#[allow(dead_code)] Registration),
    Host {
        ptr: *mut u8,
        len: usize,
    },
}

// SAFETY: the region only remembers an address range to unlock; it never reads or writes it.
unsafe impl Send for RegionLock {}
// SAFETY: as above.
unsafe impl Sync for RegionLock {}

impl Drop for RegionLock {
    fn drop(&mut self) {
        if let RegionLock::Host { ptr, len } = *self {
            // SAFETY: unlocking the range we locked; munlock does not touch the memory.
            unsafe { libc::munlock(ptr.cast(), len) };
        }
    }
}

impl std::fmt::Debug for PinnedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedRegion")
            .field("len", &self.len)
            .finish()
    }
}

impl PinnedRegion {
    /// Page-locks `ptr .. ptr + len`. More than half of the machine's memory is refused: locked
    /// pages cannot be swapped, and the rest of the machine would starve.
    ///
    /// # Safety
    /// The range stays mapped until the region is dropped, and no copy from it is in flight
    /// when it is dropped.
    pub unsafe fn new(device: DeviceSpec, ptr: *mut u8, len: usize) -> Result<PinnedRegion> {
        if len == 0 {
            return Err(LoaderError::Config(
                "cannot page-lock an empty range".into(),
            ));
        }
        if let Some(total) = mem_total() {
            if len as u64 > total / 2 {
                return Err(LoaderError::PinTooLarge {
                    bytes: len as u64,
                    total,
                });
            }
        }
        let lock = match device.resolve() {
            DeviceSpec::Cuda(ordinal) => {
                let ctx = Context::new(ordinal)?;
                // SAFETY: forwarded from this function's contract.
                RegionLock::Cuda(unsafe { Registration::new(&ctx, ptr, len, false) }?)
            }
            _ => {
                // SAFETY: the caller guarantees the range is mapped.
                if unsafe { libc::mlock(ptr.cast(), len) } != 0 {
                    let source = std::io::Error::last_os_error();
                    return Err(LoaderError::Config(format!(
                        "cannot page-lock {len} bytes: {source} (the memory-lock limit, `ulimit -l`, may be too low)"
                    )));
                }
                RegionLock::Host { ptr, len }
            }
        };
        count_pinned_allocation();
        Ok(PinnedRegion { _lock: lock, len })
    }

    /// Bytes locked.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never: empty regions are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_stager(budget: usize, piece: usize) -> Stager {
        Stager::new(StagerOptions {
            device: DeviceSpec::Cpu,
            pinned_budget: budget,
            num_threads: Some(3),
            piece_bytes: Some(piece),
            ..StagerOptions::default()
        })
        .unwrap()
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn uploads_of_every_size_arrive_intact() {
        let stager = host_stager(64 << 10, 16 << 10);
        for (i, len) in [0, 1, 4095, 4096, 4097, 16 << 10, 100_000, 1 << 20, 3 << 20]
            .into_iter()
            .enumerate()
        {
            let src = pattern(len, i as u8);
            let array = stager.upload(&src).unwrap();
            assert_eq!(array.len_bytes(), len);
            assert_eq!(
                array.host_bytes().unwrap().unwrap(),
                &src[..],
                "length {len}"
            );
        }
        assert_eq!(stager.pinned_bytes(), 64 << 10);
    }

    #[test]
    fn held_arrays_stay_intact_while_the_arena_wraps() {
        let stager = host_stager(32 << 10, 8 << 10);
        let sources: Vec<Vec<u8>> = (0..50).map(|i| pattern(5000 + i * 97, i as u8)).collect();
        let arrays: Vec<DeviceArray> = sources.iter().map(|s| stager.upload(s).unwrap()).collect();
        for (src, array) in sources.iter().zip(&arrays) {
            let mut back = vec![0; src.len()];
            array.read_back(&mut back).unwrap();
            assert_eq!(&back, src);
        }
    }

    #[test]
    fn arena_fit_respects_in_flight_pieces() {
        let done = || CopyFence::Host(Arc::default());
        let mut arena = Arena::default();
        assert_eq!(arena.fit(100, 100), Some(0));
        arena.pieces.push_back((0, 60, done()));
        assert_eq!(arena.fit(100, 40), Some(60));
        assert_eq!(arena.fit(100, 41), None);
        arena.pieces.push_back((60, 90, done()));
        arena.pieces.pop_front();
        // Free: [90, 100) and [0, 60).
        assert_eq!(arena.fit(100, 10), Some(90));
        assert_eq!(arena.fit(100, 60), Some(0));
        assert_eq!(arena.fit(100, 61), None);
        arena.pieces.push_back((0, 50, done()));
        // Wrapped: free is [50, 60).
        assert_eq!(arena.fit(100, 10), Some(50));
        assert_eq!(arena.fit(100, 11), None);
    }

    #[test]
    fn to_device_moves_a_large_buffer() {
        let src = pattern(5 << 20, 7);
        let array = to_device(
            &src,
            StagerOptions {
                device: DeviceSpec::Cpu,
                pinned_budget: 1 << 20,
                ..StagerOptions::default()
            },
        )
        .unwrap();
        assert_eq!(
            crc32fast::hash(array.host_bytes().unwrap().unwrap()),
            crc32fast::hash(&src)
        );
    }

    #[test]
    fn tiny_budgets_are_refused() {
        let err = Stager::new(StagerOptions {
            device: DeviceSpec::Cpu,
            pinned_budget: 100,
            ..StagerOptions::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("too small"), "{err}");
    }
}

#[cfg(test)]
mod pin_limit_tests {
    use super::*;

    #[test]
    fn pinning_more_than_half_the_machine_is_refused_with_advice() {
        let total = mem_total().expect("/proc/meminfo");
        // Nothing is touched: the range is checked before any lock.
        let len = (total / 2 + 4096) as usize;
        let mut one = [0u8; 1];
        // SAFETY: refused before the range is used; no memory is locked or read.
        let err = unsafe { PinnedRegion::new(DeviceSpec::Cpu, one.as_mut_ptr(), len) }.unwrap_err();
        assert!(matches!(err, LoaderError::PinTooLarge { .. }), "{err:?}");
        assert!(err.to_string().contains("stream it instead"), "{err}");
    }
}
