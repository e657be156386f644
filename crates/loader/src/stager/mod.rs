//! Uploads of arbitrary host byte ranges through a fixed pinned arena: what `prefetch` and
//! `to_device` are made of.
//!
//! The arena is one page-locked allocation made at start-up. An upload reserves pieces of it in
//! FIFO order, fills each piece with a multi-threaded `memcpy`, and issues the piece's copy into
//! the destination at once, so the copy of one piece overlaps the `memcpy` of the next. A piece
//! is reused only after its copy's fence has completed. Uploads larger than the arena stream
//! through it; nothing is allocated page-locked per upload.
//!
//! Two other ways are there to choose ([`UploadMethod`]). `Register` page-locks the source in
//! place chunk by chunk (`cuMemHostRegister`), lets the copy engine read each chunk directly and
//! unlocks it once that copy has finished: almost no CPU time, but bounded by the driver's
//! registration rate. `Both` runs that lane from the back of the source while the arena lane
//! works from the front, until they meet. The arena alone is the default (`Stage`): the driver
//! registers more slowly than CPU threads copy, and serialises registration with the copies
//! the other lane issues, so a lane slows the arena down rather than adding to it
//! (docs/BENCHMARKS.md, "Seed tensor (to_device)"). `Register` is there for machines short of
//! CPU time: it spends a fraction of the arena's.
//! With a lane, the budget is shared: half for the arena, half for the chunks registered at any
//! moment. A source that is already page-locked (`pin_memory()`, `pinned()`) is copied straight
//! from by every method, with no lane.

mod gang;
mod lanes;
mod region;
#[cfg(test)]
mod tests;

use gang::CopyGang;
use lanes::{lock_in_place, LanePlan, StageLane};
pub use region::PinnedRegion;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};

use pinfeed_cuda::{Context, PinMethod, Registration};

use crate::backend::{Backend, CopyFence, DeviceBudget, DeviceSpec, Landed};
use crate::error::{panic_message, LoaderError, Result};
use crate::pool::{count_pinned_allocation, PinnedPool};
use crate::DeviceData;

/// Pieces are aligned to this, so that every `memcpy` and DMA starts on a cache line.
const ALIGN: usize = 4096;

/// Registered chunks are whole pages of the source.
const PAGE: usize = 4096;

/// The largest chunk the register lane locks at once: big enough that the driver's fixed cost
/// per call is small, small enough that the lane starts soon and holds little of the budget.
const MAX_REGISTER_CHUNK: usize = 32 << 20;

/// The smallest chunk worth registering: below this a `memcpy` is cheaper than the driver calls,
/// whose cost per call does not shrink with the chunk.
const MIN_REGISTER_CHUNK: usize = 4 << 20;

/// Copies from an already page-locked source are issued in pieces of at most this size.
const DIRECT_PIECE: usize = 256 << 20;

/// How an upload moves a pageable source to the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UploadMethod {
    /// The arena alone: a multi-threaded `memcpy` into pinned memory, then the DMA. The
    /// default: registration cannot keep up with CPU threads copying (see the module docs).
    #[default]
    Stage,
    /// Both lanes at once, from opposite ends of the source: CPU threads copy into the arena,
    /// one thread registers chunks in place. Uploads too small for two registered chunks use
    /// the arena alone.
    Both,
    /// Registration alone: every whole page of the source is registered chunk by chunk and
    /// copied from in place; the arena takes only the partial pages at either end.
    Register,
}

impl std::str::FromStr for UploadMethod {
    type Err = LoaderError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "both" => Ok(UploadMethod::Both),
            "stage" => Ok(UploadMethod::Stage),
            "register" => Ok(UploadMethod::Register),
            _ => Err(LoaderError::Config(format!(
                "unknown upload method {s:?}: expected both, stage or register"
            ))),
        }
    }
}

impl std::fmt::Display for UploadMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            UploadMethod::Both => "both",
            UploadMethod::Stage => "stage",
            UploadMethod::Register => "register",
        })
    }
}

/// Bytes a [`Stager`] has moved, by the way they went, since it was made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UploadCounters {
    /// Copied by the CPU into the arena, then by DMA.
    pub staged_bytes: u64,
    /// Copied by DMA from chunks of the source registered for the purpose.
    pub registered_bytes: u64,
    /// Copied by DMA from a source that was already page-locked.
    pub direct_bytes: u64,
    /// Why the register lane stopped, when registration failed; its chunks were staged.
    pub register_error: Option<String>,
}

/// How a [`Stager`] runs.
#[derive(Clone, Debug)]
pub struct StagerOptions {
    /// Where uploads go.
    pub device: DeviceSpec,
    /// Bytes page-locked at most: the arena, plus the chunks of a source the register lane
    /// holds registered at once (half each, see [`Stager::new`]).
    pub pinned_budget: usize,
    /// Threads that copy into the arena; `None` for as many as keep up with the bus on this
    /// machine ([`crate::tune`]). They start with the stager and wait between copies; a
    /// copy wakes one per 256 KiB chunk it has, up to all of them.
    pub num_threads: Option<usize>,
    /// How the arena is page-locked on CUDA.
    pub pin_method: PinMethod,
    /// Largest piece one copy moves; `None` for a quarter of the arena, at most 64 MiB, so that
    /// several pieces are in flight at once.
    pub piece_bytes: Option<usize>,
    /// How large uploads move (see [`UploadMethod`]).
    pub method: UploadMethod,
}

/// The staging arena's size when the user sets no budget: 64 MiB. Smaller is faster up to a
/// point: the arena is written by the CPU and read by the copy engine at once, and an arena
/// that stays in the CPU's last-level cache spares memory bandwidth both need. Much smaller
/// arenas measured slower too (docs/BENCHMARKS.md, "Seed tensor (to_device)").
pub const DEFAULT_STAGING_BUDGET: usize = 64 << 20;

impl Default for StagerOptions {
    fn default() -> Self {
        StagerOptions {
            device: DeviceSpec::Auto,
            pinned_budget: DEFAULT_STAGING_BUDGET,
            num_threads: None,
            pin_method: PinMethod::Register,
            piece_bytes: None,
            method: UploadMethod::Stage,
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
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    staged: AtomicU64,
    registered: AtomicU64,
    direct: AtomicU64,
    register_error: Mutex<Option<String>>,
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
    /// The copy threads besides the caller's, parked between copies.
    gang: CopyGang,
    piece: usize,
    method: UploadMethod,
    /// Bytes of the source the register lane may hold registered at once; 0 turns it off.
    register_budget: usize,
    /// Bytes the register lane registers per call.
    register_chunk: usize,
    /// How many copy threads, and why.
    threads: crate::tune::ThreadChoice,
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("device", &self.device())
            .field("pinned_bytes", &self.pinned_bytes())
            .field("threads", &(self.gang.helpers.len() + 1))
            .field("piece", &self.piece)
            .field("method", &self.method)
            .field("register_budget", &self.register_budget)
            .finish()
    }
}

impl Stager {
    /// Makes the arena: the one page-locked allocation of this stager. With a register lane
    /// ([`UploadMethod::Both`] or `Register`) the arena gets half the budget and the lane the
    /// other half; a budget too small to register chunks of at least 4 MiB two at a time gives
    /// the arena all of it.
    pub fn new(options: StagerOptions) -> Result<Stager> {
        let total = options.pinned_budget / ALIGN * ALIGN;
        if total < 2 * ALIGN {
            return Err(LoaderError::Config(format!(
                "pinned budget of {} bytes is too small for a staging arena: give at least {} bytes",
                options.pinned_budget,
                2 * ALIGN
            )));
        }
        let half = total / 2 / ALIGN * ALIGN;
        let (capacity, register_budget) = match options.method {
            UploadMethod::Stage => (total, 0),
            _ if total - half < 2 * MIN_REGISTER_CHUNK => (total, 0),
            _ => (half, total - half),
        };
        let register_chunk = (register_budget / 2).min(MAX_REGISTER_CHUNK) / PAGE * PAGE;
        let piece = options
            .piece_bytes
            .unwrap_or((capacity / 4).min(64 << 20))
            .clamp(ALIGN, capacity / 2)
            / ALIGN
            * ALIGN;
        if let Some(threads) = options.num_threads {
            crate::tune::check_threads(threads)?;
        }
        let backend = Arc::new(Backend::new(options.device, options.pin_method)?);
        let choice = match options.num_threads {
            Some(n) => crate::tune::ThreadChoice {
                threads: n.max(1),
                rates: None,
                reason: format!("{}: as asked", n.max(1)),
            },
            None => crate::tune::choose(backend.context(), options.pinned_budget),
        };
        let threads = choice.threads.max(1);
        let pool = backend.pinned_pool(capacity, 1)?;
        let gang = CopyGang::start(threads - 1)?;
        Ok(Stager {
            shared: Arc::new(StagerShared {
                arena: Mutex::new(Arena::default()),
                pool,
                backend,
                budget: DeviceBudget::new(None),
                counters: Counters::default(),
            }),
            upload: Mutex::new(()),
            gang,
            piece,
            method: options.method,
            register_budget,
            register_chunk,
            threads: choice,
        })
    }

    /// How large uploads move.
    pub fn method(&self) -> UploadMethod {
        self.method
    }

    /// How many threads copy into the arena (the caller's among them), and why that many.
    pub fn threads(&self) -> &crate::tune::ThreadChoice {
        &self.threads
    }

    /// Bytes moved so far, by the way they went.
    pub fn counters(&self) -> UploadCounters {
        let c = &self.shared.counters;
        UploadCounters {
            staged_bytes: c.staged.load(Ordering::Relaxed),
            registered_bytes: c.registered.load(Ordering::Relaxed),
            direct_bytes: c.direct.load(Ordering::Relaxed),
            register_error: c
                .register_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    /// Where uploads go.
    pub fn device(&self) -> DeviceSpec {
        self.shared.backend.device()
    }

    /// Bytes of page-locked memory in the arena.
    pub fn pinned_bytes(&self) -> usize {
        self.shared.pool.bytes()
    }

    /// The most bytes page-locked at once: the arena plus what the register lane may hold.
    pub fn pinned_budget(&self) -> usize {
        self.shared.pool.bytes() + self.register_budget
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

    /// Copies `src` into new device memory. Returns once nothing reads `src` any more (the
    /// arena lane's last copies may still be in flight); the result's fence completes when all
    /// of it has arrived. Blocks while the arena is full.
    pub fn upload(&self, src: &[u8]) -> Result<DeviceArray> {
        let _one_at_a_time = self.upload.lock().unwrap_or_else(|p| p.into_inner());
        let shared = &self.shared;
        let mut memory = shared.backend.alloc(src.len(), &shared.budget)?;
        let dst = memory.write_address();
        let ready = if src.is_empty() {
            shared.backend.completed_fence()?
        } else if self.already_page_locked(src)? {
            self.upload_direct(src, dst)?
        } else {
            self.upload_lanes(src, dst)?
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

    /// Whether `src` is page-locked already, so that the copy engine can read it as it is.
    fn already_page_locked(&self, src: &[u8]) -> Result<bool> {
        let Some(ctx) = self.shared.backend.context() else {
            return Ok(false);
        };
        let last = src.as_ptr().wrapping_add(src.len() - 1);
        Ok(pinfeed_cuda::is_page_locked(ctx, src.as_ptr())?
            && pinfeed_cuda::is_page_locked(ctx, last)?)
    }

    /// Copies an already page-locked source straight to `dst` and waits until it has been read.
    fn upload_direct(&self, src: &[u8], dst: u64) -> Result<CopyFence> {
        let mut last = None;
        for (i, piece) in src.chunks(DIRECT_PIECE).enumerate() {
            // SAFETY: `src` outlives the copy (we wait for it below) and the destination range
            // lies inside the allocation of `src.len()` bytes at `dst`, which nobody reads
            // before the returned fence.
            let fence = unsafe {
                self.shared.backend.copy_to(
                    piece.as_ptr(),
                    dst + (i * DIRECT_PIECE) as u64,
                    piece.len(),
                )
            }?;
            last = Some(fence);
        }
        let fence = last.expect("a non-empty source has a piece");
        pinfeed_ring::Fence::wait(&fence)?;
        self.shared
            .counters
            .direct
            .fetch_add(src.len() as u64, Ordering::Relaxed);
        Ok(fence)
    }

    /// The arena lane and, for large sources, the register lane.
    fn upload_lanes(&self, src: &[u8], dst: u64) -> Result<CopyFence> {
        let plan = LanePlan::new(src, self);
        std::thread::scope(|scope| -> Result<CopyFence> {
            let register = (plan.chunks > 0).then(|| {
                let plan = &plan;
                scope.spawn(move || self.register_lane(src, dst, plan))
            });
            let mut stage = StageLane {
                stager: self,
                gang: &self.gang,
                src,
                dst,
                last: None,
            };
            let staged = (|| -> Result<()> {
                stage.range(0, plan.head)?;
                while let Some(i) = plan.take_front() {
                    let (start, end) = plan.chunk(i);
                    stage.range(start, end)?;
                }
                Ok(())
            })();
            if staged.is_err() {
                plan.abandon();
            }
            let returned = match register {
                Some(lane) => lane.join().unwrap_or_else(|panic| {
                    Err(LoaderError::Worker {
                        thread: "register lane",
                        message: panic_message(panic.as_ref()),
                    })
                }),
                None => Ok(Vec::new()),
            };
            staged?;
            // Chunks the register lane could not lock, then the partial page at the end.
            for i in returned? {
                let (start, end) = plan.chunk(i);
                stage.range(start, end)?;
            }
            stage.range(plan.tail, src.len())?;
            match stage.last {
                Some(fence) => Ok(fence),
                // Everything went through the register lane, which waited for its copies.
                None => self.shared.backend.completed_fence(),
            }
        })
    }

    /// Takes chunks from the back of the plan, registers each, copies from it in place and
    /// unregisters it once that copy is done, holding at most `register_budget` bytes. Returns
    /// the chunks it took but could not register (registration failed), for the arena lane.
    fn register_lane(&self, src: &[u8], dst: u64, plan: &LanePlan) -> Result<Vec<usize>> {
        let backend = &self.shared.backend;
        let counters = &self.shared.counters;
        let mut held: VecDeque<(Option<Registration>, CopyFence, usize)> = VecDeque::new();
        let mut held_bytes = 0;
        let result = (|| -> Result<Vec<usize>> {
            while let Some(i) = plan.take_back() {
                let (start, end) = plan.chunk(i);
                let len = end - start;
                while held_bytes + len > self.register_budget {
                    let (lock, fence, n) = held.pop_front().expect("held bytes are in the queue");
                    pinfeed_ring::Fence::wait(&fence)?;
                    drop(lock);
                    held_bytes -= n;
                }
                let ptr = src[start..end].as_ptr();
                let lock = match lock_in_place(backend, ptr, len) {
                    Ok(lock) => lock,
                    Err(e) => {
                        *counters
                            .register_error
                            .lock()
                            .unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                        // This chunk and every one not yet taken go through the arena.
                        let mut left = vec![i];
                        left.extend(std::iter::from_fn(|| plan.take_back()));
                        return Ok(left);
                    }
                };
                // SAFETY: the chunk stays locked and unwritten (we hold `&src`) until its fence
                // completes, which is awaited before the lock is dropped; the destination range
                // lies inside the allocation at `dst` and is disjoint from every other chunk's.
                let fence = unsafe { backend.copy_to(ptr, dst + start as u64, len) }?;
                held.push_back((lock, fence, len));
                held_bytes += len;
                counters.registered.fetch_add(len as u64, Ordering::Relaxed);
            }
            Ok(Vec::new())
        })();
        if result.is_err() {
            plan.abandon();
        }
        // Unlock only what nobody reads any more, also on the way out of an error.
        for (lock, fence, _) in held.drain(..) {
            let waited = pinfeed_ring::Fence::wait(&fence);
            drop(lock);
            waited?;
        }
        result
    }
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
    unsafe fn release_after(mut self: Box<Self>, stream: u64) -> Result<()> {
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
