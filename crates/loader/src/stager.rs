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
//! works from the front, until they meet. On the H200 machine the arena alone was fastest
//! (35.1 GB/s for the seed tensor against 14.6 for `Register` and 16.9 for `Both`: the driver
//! serialises registration with the copies the other lane issues), so `Stage` is the default;
//! `Register` is there for machines short of CPU time (192 ms of CPU against 902 for 2.7 GB).
//! With a lane, the budget is shared: half for the arena, half for the chunks registered at any
//! moment. A source that is already page-locked (`pin_memory()`, `pinned()`) is copied straight
//! from by every method, with no lane.

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

/// The smallest chunk worth registering: below this a `memcpy` is cheaper than the driver calls
/// (0.8 ms to register 2.5 MiB on the H200 machine, REFERENCE.md).
const MIN_REGISTER_CHUNK: usize = 4 << 20;

/// Copies from an already page-locked source are issued in pieces of at most this size.
const DIRECT_PIECE: usize = 256 << 20;

/// How an upload moves a pageable source to the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UploadMethod {
    /// The arena alone: a multi-threaded `memcpy` into pinned memory, then the DMA. The
    /// default: fastest on the H200 machine (docs/BENCHMARKS.md).
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
    /// Threads that copy into the arena; `None` for one per core, at most
    /// [`DEFAULT_MAX_COPY_THREADS`]. They start with the stager and wait between copies; a
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
/// that stays in the CPU's last-level cache spares memory bandwidth both need. On the H200
/// machine (300 MiB L3) the seed tensor moved at 53 GB/s through 64 MiB, 50-53 through 128,
/// 40-45 through 256 and 37-41 through 32 MiB (docs/BENCHMARKS.md, arena sweep).
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
        let threads = options
            .num_threads
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map_or(4, |n| n.get())
                    .min(DEFAULT_MAX_COPY_THREADS)
            })
            .max(1);
        let backend = Arc::new(Backend::new(options.device, options.pin_method)?);
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
        })
    }

    /// How large uploads move.
    pub fn method(&self) -> UploadMethod {
        self.method
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

/// How an upload's source is split between the lanes: the partial page at either end goes
/// through the arena; the whole pages between are cut into chunks that the arena lane takes
/// from the front and the register lane from the back, until they meet.
struct LanePlan {
    /// End of the leading partial page (the first page-aligned offset of the source).
    head: usize,
    /// Start of the trailing partial page.
    tail: usize,
    chunk: usize,
    /// Chunks between `head` and `tail`; 0 when there is no register lane.
    chunks: usize,
    /// Whether the arena lane takes chunks too ([`UploadMethod::Both`]).
    front_lane: bool,
    /// The next chunk the front lane takes, and one past the next the back lane takes.
    claims: Mutex<(usize, usize)>,
}

impl LanePlan {
    fn new(src: &[u8], stager: &Stager) -> LanePlan {
        let addr = src.as_ptr() as usize;
        let head = (addr.next_multiple_of(PAGE) - addr).min(src.len());
        let tail = ((addr + src.len()) / PAGE * PAGE)
            .saturating_sub(addr)
            .max(head);
        let chunk = stager.register_chunk.max(PAGE);
        let whole = (tail - head).div_ceil(chunk);
        // Both lanes: worth it from two whole chunks on; registration alone: from one chunk.
        let enough = match stager.method {
            UploadMethod::Both => tail - head >= 2 * chunk,
            UploadMethod::Register => whole >= 1,
            UploadMethod::Stage => false,
        };
        let chunks = if stager.register_budget > 0 && enough {
            whole
        } else {
            0
        };
        let (head, tail) = if chunks == 0 {
            // The arena takes everything, as one range.
            (src.len(), src.len())
        } else {
            (head, tail)
        };
        LanePlan {
            head,
            tail,
            chunk,
            chunks,
            front_lane: stager.method == UploadMethod::Both,
            claims: Mutex::new((0, chunks)),
        }
    }

    /// `[start, end)` of chunk `i`, as offsets into the source.
    fn chunk(&self, i: usize) -> (usize, usize) {
        let start = self.head + i * self.chunk;
        (start, (start + self.chunk).min(self.tail))
    }

    fn take_front(&self) -> Option<usize> {
        if !self.front_lane {
            return None;
        }
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        (claims.0 < claims.1).then(|| {
            claims.0 += 1;
            claims.0 - 1
        })
    }

    fn take_back(&self) -> Option<usize> {
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        (claims.0 < claims.1).then(|| {
            claims.1 -= 1;
            claims.1
        })
    }

    /// Leaves the chunks nobody has taken yet: the upload failed.
    fn abandon(&self) {
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        claims.0 = claims.1;
    }
}

/// A page-locked chunk of the source, or `None` where no lock is needed: the host backend, or
/// memory the driver had page-locked already.
fn lock_in_place(backend: &Backend, ptr: *const u8, len: usize) -> Result<Option<Registration>> {
    let Some(ctx) = backend.context() else {
        return Ok(None);
    };
    // SAFETY: the chunk is part of a source slice borrowed for the whole upload, so it stays
    // mapped; the register lane drops the registration only after the copy reading it is done.
    // Read-only: the source may be a read-only file mapping (a numpy memmap).
    match unsafe { Registration::new(ctx, ptr.cast_mut(), len, true) } {
        Ok(registration) => Ok(Some(registration)),
        Err(e) if e.is_already_registered() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The arena lane of one upload.
struct StageLane<'a> {
    stager: &'a Stager,
    gang: &'a CopyGang,
    src: &'a [u8],
    dst: u64,
    /// The fence of the last copy this lane issued.
    last: Option<CopyFence>,
}

impl StageLane<'_> {
    /// Copies `src[start..end]` through the arena to the same offsets of the destination.
    fn range(&mut self, start: usize, end: usize) -> Result<()> {
        let shared = &self.stager.shared;
        let mut offset = start;
        for piece in self.src[start..end].chunks(self.stager.piece) {
            let len = piece.len();
            let at = self.stager.reserve(len.next_multiple_of(ALIGN))?;
            // SAFETY: `reserve` returned `at .. at + len` free: no copy reads it and no other
            // upload runs (the upload lock); only this lane reserves.
            let staging = unsafe { shared.pool.bytes_mut(at, len) };
            self.gang.copy(staging, piece);
            // SAFETY: the staging piece stays reserved (in the arena's list) until this fence
            // completes; the destination range lies inside the upload's allocation, disjoint
            // from every other piece and chunk, and nobody reads it before the upload's fence.
            let fence = unsafe {
                shared
                    .backend
                    .copy_to(staging.as_ptr(), self.dst + offset as u64, len)
            }?;
            shared
                .arena
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pieces
                .push_back((at, at + len.next_multiple_of(ALIGN), fence.clone()));
            shared
                .counters
                .staged
                .fetch_add(len as u64, Ordering::Relaxed);
            self.last = Some(fence);
            offset += len;
        }
        Ok(())
    }
}

/// Copy threads a stager starts at most unless told otherwise: the fewest that keep up with the
/// bus, because each thread more makes every thread's copy dearer. On the 16-core H200 machine
/// (docs/BENCHMARKS.md) the CPU copied 8.3 GB/s per CPU-second at 4 threads while the copy
/// engine read, 7.0-7.7 at 8 to 12 and 6.2 at 16; 8 threads moved the seed tensor at 47-52 GB/s
/// (the bus: 54) for 354-380 ms of CPU, 12 at 54 GB/s for 417-460 ms.
pub const DEFAULT_MAX_COPY_THREADS: usize = 8;

/// What gang threads take one at a time: small enough that a thread the scheduler delays (16
/// copy threads on 16 cores share them with the driver and the caller) holds the piece up by
/// little, large enough that taking one costs nothing beside copying it.
const CHUNK: usize = 256 << 10;

/// One `memcpy` shared by the gang: its threads take chunks until none is left.
struct Job {
    dst: *mut u8,
    src: *const u8,
    len: usize,
    /// The next chunk to take.
    next: AtomicUsize,
    /// Chunks copied so far; `all_copied` is signalled when it reaches the count.
    copied: Mutex<usize>,
    all_copied: Condvar,
}

// SAFETY: the two ranges are disjoint, and the sender keeps them valid and touches them in no
// other way until every chunk is copied (`CopyGang::copy` waits for that); a thread that takes
// the job later finds no chunk left and dereferences neither pointer.
unsafe impl Send for Job {}
// SAFETY: as above; threads share only the atomic counter and the mutex, and each chunk index
// is taken by one thread alone.
unsafe impl Sync for Job {}

impl Job {
    fn chunks(&self) -> usize {
        self.len.div_ceil(CHUNK)
    }

    /// Copies chunks until none is left to take.
    fn work(&self) {
        let chunks = self.chunks();
        let mut mine = 0;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= chunks {
                break;
            }
            let at = i * CHUNK;
            let len = CHUNK.min(self.len - at);
            // SAFETY: chunk `i` lies inside both ranges, which stay valid until all chunks are
            // copied (see `Job`), and no other thread takes the same index.
            unsafe { std::ptr::copy_nonoverlapping(self.src.add(at), self.dst.add(at), len) };
            mine += 1;
        }
        if mine > 0 {
            // The lock also publishes this thread's writes to the caller that waits on it.
            let mut copied = self.copied.lock().unwrap_or_else(|p| p.into_inner());
            *copied += mine;
            if *copied == chunks {
                self.all_copied.notify_one();
            }
        }
    }
}

/// Threads that share each `memcpy` of an upload, chunk by chunk. Started with the stager and
/// parked on a channel between copies, so that an upload of a few MB (a prefetched batch) is
/// copied by as many threads as it has chunks without paying to start them.
struct CopyGang {
    helpers: Vec<mpsc::Sender<Arc<Job>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl CopyGang {
    /// Starts `helpers` threads (the caller of [`copy`](CopyGang::copy) is one more).
    fn start(helpers: usize) -> Result<CopyGang> {
        let mut gang = CopyGang {
            helpers: Vec::with_capacity(helpers),
            threads: Vec::with_capacity(helpers),
        };
        for _ in 0..helpers {
            let (tx, rx) = mpsc::channel::<Arc<Job>>();
            let thread = std::thread::Builder::new()
                .name("pinfeed-copy".into())
                .spawn(move || {
                    for job in rx {
                        job.work();
                    }
                })
                .map_err(|source| LoaderError::Thread {
                    what: "arena copy",
                    source,
                })?;
            gang.helpers.push(tx);
            gang.threads.push(thread);
        }
        Ok(gang)
    }

    /// Copies `src` into the start of `dst`, shared by the gang (one thread for small copies).
    fn copy(&self, dst: &mut [u8], src: &[u8]) {
        let dst = &mut dst[..src.len()];
        // No more helpers than chunks beyond the caller's first.
        let helpers = self
            .helpers
            .len()
            .min((src.len() / CHUNK).saturating_sub(1));
        if helpers == 0 {
            dst.copy_from_slice(src);
            return;
        }
        let job = Arc::new(Job {
            dst: dst.as_mut_ptr(),
            src: src.as_ptr(),
            len: src.len(),
            next: AtomicUsize::new(0),
            copied: Mutex::new(0),
            all_copied: Condvar::new(),
        });
        for helper in &self.helpers[..helpers] {
            // A helper that is gone (it cannot be: they stop only when the gang is dropped)
            // leaves its chunks to the others.
            let _ = helper.send(Arc::clone(&job));
        }
        job.work();
        let chunks = job.chunks();
        let mut copied = job.copied.lock().unwrap_or_else(|p| p.into_inner());
        while *copied < chunks {
            copied = job
                .all_copied
                .wait(copied)
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Drop for CopyGang {
    fn drop(&mut self) {
        // Closing the channels ends the helpers' loops.
        self.helpers.clear();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
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
        if let Some(total) = crate::system::mem_total() {
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
                    return Err(LoaderError::Lock {
                        bytes: len,
                        source: std::io::Error::last_os_error(),
                    });
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

    fn lanes_stager(method: UploadMethod) -> Stager {
        Stager::new(StagerOptions {
            device: DeviceSpec::Cpu,
            pinned_budget: 16 << 20,
            num_threads: Some(3),
            method,
            ..StagerOptions::default()
        })
        .unwrap()
    }

    #[test]
    fn every_method_delivers_every_byte_from_any_alignment() {
        // Sources starting and ending at every kind of offset from a page boundary, smaller
        // and larger than the register lane's chunks (4 MiB with this budget).
        let backing = pattern((41 << 20) + 3 * 4096, 11);
        for method in [
            UploadMethod::Both,
            UploadMethod::Stage,
            UploadMethod::Register,
        ] {
            let stager = lanes_stager(method);
            for (start, len) in [
                (0, 41 << 20),
                (1, (41 << 20) - 1),
                (4095, 9 << 20),
                (4096, 8 << 20),
                (123, (4 << 20) + 77),
                (7, 4096),
                (0, 1),
            ] {
                let src = &backing[start..start + len];
                let array = stager.upload(src).unwrap();
                assert_eq!(
                    crc32fast::hash(array.host_bytes().unwrap().unwrap()),
                    crc32fast::hash(src),
                    "{method} from offset {start}, {len} bytes"
                );
            }
        }
    }

    #[test]
    fn large_uploads_use_both_lanes_and_small_ones_the_arena() {
        let src = pattern(40 << 20, 3);
        let stager = lanes_stager(UploadMethod::Both);
        assert_eq!(
            stager.pinned_bytes(),
            8 << 20,
            "half the budget is the arena"
        );
        assert_eq!(stager.pinned_budget(), 16 << 20);
        // Less than two whole chunks (4 MiB each here) between the partial pages: arena only.
        stager.upload(&src[..6 << 20]).unwrap();
        let small = stager.counters();
        assert_eq!(small.staged_bytes, 6 << 20, "{small:?}");
        assert_eq!(small.registered_bytes, 0, "{small:?}");
        stager.upload(&src).unwrap();
        let c = stager.counters();
        assert_eq!(
            c.staged_bytes + c.registered_bytes,
            (46 << 20) as u64,
            "{c:?}"
        );
        assert!(
            c.registered_bytes > 0 && c.staged_bytes > (6 << 20),
            "{c:?}"
        );
        assert_eq!(c.direct_bytes, 0);
        assert_eq!(c.register_error, None);

        let register = lanes_stager(UploadMethod::Register);
        let base = src.as_ptr() as usize;
        let skip = base.next_multiple_of(4096) - base + 100;
        register.upload(&src[skip..]).unwrap();
        let c = register.counters();
        // Only the partial pages at either end go through the arena.
        assert!(c.staged_bytes < 2 * 4096, "{c:?}");
        assert_eq!(
            c.staged_bytes + c.registered_bytes,
            (src.len() - skip) as u64
        );

        let stage = lanes_stager(UploadMethod::Stage);
        assert_eq!(
            stage.pinned_bytes(),
            16 << 20,
            "no lane: the arena has it all"
        );
        stage.upload(&src).unwrap();
        assert_eq!(stage.counters().registered_bytes, 0);
    }

    #[test]
    fn small_budgets_leave_the_register_lane_out() {
        let stager = Stager::new(StagerOptions {
            device: DeviceSpec::Cpu,
            pinned_budget: 8 << 20,
            method: UploadMethod::Register,
            ..StagerOptions::default()
        })
        .unwrap();
        assert_eq!(stager.pinned_bytes(), 8 << 20);
        let src = pattern(20 << 20, 5);
        let array = stager.upload(&src).unwrap();
        assert_eq!(array.host_bytes().unwrap().unwrap(), &src[..]);
        assert_eq!(stager.counters().registered_bytes, 0);
    }

    #[test]
    fn upload_methods_parse_and_print() {
        for m in [
            UploadMethod::Both,
            UploadMethod::Stage,
            UploadMethod::Register,
        ] {
            assert_eq!(m.to_string().parse::<UploadMethod>().unwrap(), m);
        }
        let err = "fast".parse::<UploadMethod>().unwrap_err();
        assert!(
            err.to_string().contains("expected both, stage or register"),
            "{err}"
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
        let total = crate::system::mem_total().expect("/proc/meminfo");
        // Nothing is touched: the range is checked before any lock.
        let len = (total / 2 + 4096) as usize;
        let mut one = [0u8; 1];
        // SAFETY: refused before the range is used; no memory is locked or read.
        let err = unsafe { PinnedRegion::new(DeviceSpec::Cpu, one.as_mut_ptr(), len) }.unwrap_err();
        assert!(matches!(err, LoaderError::PinTooLarge { .. }), "{err:?}");
        assert!(err.to_string().contains("stream it instead"), "{err}");
    }
}
