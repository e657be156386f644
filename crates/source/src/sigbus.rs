//! A file that shrinks under a mapping: the `SIGBUS` of a copy out of it becomes an error.
//!
//! Reading a page of a shared file mapping that lies wholly past the end of the file (the file
//! was truncated after it was mapped), or whose read from disk fails, raises `SIGBUS` in the
//! reading thread, which kills the process by default. The mapped gather
//! ([`crate::mapped::MappedFile`]) registers its mapping here; a process-wide handler, installed
//! the first time a mapping is registered, recognises faults inside a registered mapping, puts
//! a read-only page of zeroes in place of the page that faulted (so that the copy resumes),
//! and counts the fault on the mapping. The gather sees the count change and reads the batch
//! again with `pread`, which reports the short file ([`SourceError::Truncated`]) or the I/O
//! error; a mapping that faulted once is not read again.
//!
//! Every other `SIGBUS` goes to the handler that was installed before this one (Rust's own
//! stack-overflow handler, Python's `faulthandler`, or the default action), as if this one were
//! not there. A handler installed after this one, that does not pass faults on, takes the
//! guard away: a truncated file then kills the process as it would without the guard.
//!
//! [`SourceError::Truncated`]: crate::SourceError::Truncated

use std::ptr;
use std::sync::atomic::{fence, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// One registered mapping: bytes `start .. end` of the address space.
///
/// Entries are never freed (a handler may be reading one at any time); a released entry is
/// reused by the next registration. `start` and `end` change only under [`WRITERS`], inside a
/// sequence-lock update: `seq` is odd while they change, and moves on by two with each update,
/// so a handler that sees the same even `seq` before and after reading them read a consistent
/// pair.
struct Entry {
    seq: AtomicUsize,
    /// Both 0 while the entry is free.
    start: AtomicUsize,
    end: AtomicUsize,
    /// Faults of the current mapping that the handler answered.
    faults: AtomicU64,
    /// The next entry of the list; set once, before the entry is published.
    next: AtomicPtr<Entry>,
}

/// Every entry ever made, newest first.
static HEAD: AtomicPtr<Entry> = AtomicPtr::new(ptr::null_mut());

/// Serialises registration and release (never taken by the handler).
static WRITERS: Mutex<()> = Mutex::new(());

/// The action in place before ours, for faults that are not ours.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Whether our handler is installed, or why it could not be.
static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();

/// The page size, read at installation (the handler may not call `sysconf`).
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// Held by the unit tests that register guards, so that one of them can tell which entry a
/// registration takes.
#[cfg(test)]
pub(crate) static TEST_GUARDS: Mutex<()> = Mutex::new(());

/// A registered mapping; released on drop, which must come before the mapping is unmapped.
pub struct Guard {
    entry: &'static Entry,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("faults", &self.faults())
            .finish()
    }
}

impl Guard {
    /// Faults inside the mapping so far; each left a page of zeroes where file data was.
    pub fn faults(&self) -> u64 {
        self.entry.faults.load(Ordering::SeqCst)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _writers = WRITERS.lock().unwrap_or_else(|p| p.into_inner());
        update(self.entry, 0, 0);
    }
}

/// Guards `len` bytes from `start` (a mapping of a file made by the caller), installing the
/// handler first if this is the first guard. An error says why the handler cannot be
/// installed; the caller should not copy out of the mapping then.
pub(crate) fn guard(start: *const u8, len: usize) -> Result<Guard, String> {
    install()?;
    let _writers = WRITERS.lock().unwrap_or_else(|p| p.into_inner());
    let mut at = HEAD.load(Ordering::Acquire);
    // SAFETY: entries are leaked boxes, never freed; `at` is null or one of them.
    while let Some(entry) = unsafe { at.as_ref() } {
        if entry.end.load(Ordering::Relaxed) == 0 {
            update(entry, start as usize, start as usize + len);
            return Ok(Guard { entry });
        }
        at = entry.next.load(Ordering::Acquire);
    }
    let entry: &'static Entry = Box::leak(Box::new(Entry {
        seq: AtomicUsize::new(0),
        start: AtomicUsize::new(start as usize),
        end: AtomicUsize::new(start as usize + len),
        faults: AtomicU64::new(0),
        next: AtomicPtr::new(HEAD.load(Ordering::Relaxed)),
    }));
    // Publishing the entry with its fields written: the handler reads it after this store.
    HEAD.store(ptr::from_ref(entry).cast_mut(), Ordering::Release);
    Ok(Guard { entry })
}

/// Sets an entry's range (0, 0 frees it) in a sequence-lock update; under [`WRITERS`].
fn update(entry: &Entry, start: usize, end: usize) {
    let seq = entry.seq.load(Ordering::Relaxed);
    entry.seq.store(seq + 1, Ordering::Relaxed);
    fence(Ordering::Release);
    entry.start.store(start, Ordering::Relaxed);
    entry.end.store(end, Ordering::Relaxed);
    entry.faults.store(0, Ordering::Relaxed);
    entry.seq.store(seq + 2, Ordering::Release);
}

/// The registered entry holding `addr`. Only atomic loads: safe in a signal handler.
fn find(addr: usize) -> Option<&'static Entry> {
    let mut at = HEAD.load(Ordering::Acquire);
    // SAFETY: entries are leaked boxes, never freed; `at` is null or one of them.
    while let Some(entry) = unsafe { at.as_ref() } {
        let before = entry.seq.load(Ordering::Acquire);
        let (start, end) = (
            entry.start.load(Ordering::Relaxed),
            entry.end.load(Ordering::Relaxed),
        );
        fence(Ordering::Acquire);
        // An entry being updated is not the one of a copy in progress: a mapping's entry
        // stays as it is while the mapping lives.
        if before % 2 == 0
            && entry.seq.load(Ordering::Relaxed) == before
            && (start..end).contains(&addr)
        {
            return Some(entry);
        }
        at = entry.next.load(Ordering::Acquire);
    }
    None
}

fn install() -> Result<(), String> {
    INSTALLED
        .get_or_init(|| {
            // SAFETY: sysconf has no preconditions.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            if page > 0 {
                PAGE.store(page as usize, Ordering::Relaxed);
            }
            // SAFETY: an all-zero sigaction is a valid value (no handler, no flags, empty mask).
            let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
            action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
            // SA_ONSTACK: a thread with an alternate signal stack (Rust programs give each
            // thread one) handles the fault there.
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            // SAFETY: all-zero is a valid previous action to be overwritten.
            let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: valid pointers to sigaction structs; the mask is emptied first.
            let rc = unsafe {
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(libc::SIGBUS, &action, &mut previous)
            };
            if rc != 0 {
                return Err(format!(
                    "cannot install a SIGBUS handler: {}",
                    std::io::Error::last_os_error()
                ));
            }
            // A fault not ours before this store finds no previous action and gets the default
            // one, which is what it would most likely have had.
            let _ = PREVIOUS.set(previous);
            Ok(())
        })
        .clone()
}

/// The handler. Async-signal-safe: atomic loads and stores, `mmap`, and for faults that are
/// not ours the previous action.
extern "C" fn on_sigbus(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo (SA_SIGINFO); si_addr is meaningful for the
    // fault codes checked before it is used.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code == libc::BUS_ADRERR {
        if let Some(entry) = find(addr) {
            let page_size = PAGE.load(Ordering::Relaxed);
            let page = addr & !(page_size - 1);
            // Counted before the page changes: a thread that reads the zeroes after the
            // replacement then also sees the count.
            entry.faults.fetch_add(1, Ordering::SeqCst);
            // A raw mmap, not memmap2: only a MAP_FIXED replacement of one page, made inside a
            // signal handler (async-signal-safe, no allocation), does what is needed here.
            // SAFETY: the page lies inside a live mapping of ours (registered entries are
            // unregistered before their mapping goes), which nothing but our copies reads;
            // replacing it with zeroes changes what those copies read, and they check the count.
            let replaced = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    page_size,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if replaced != libc::MAP_FAILED {
                return;
            }
        }
    }
    pass_on(signal, info, context);
}

/// Hands a fault that is not ours to the action in place before ours.
fn pass_on(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let previous = PREVIOUS.get();
    let handler = previous.map_or(libc::SIG_DFL, |p| p.sa_sigaction);
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // The default action: put it back and let the fault happen again on return (or, for a
        // signal sent by another process, send it again: it stays blocked until we return).
        // SAFETY: an all-zero sigaction with SIG_DFL (0) is the default action.
        let mut default: libc::sigaction = unsafe { std::mem::zeroed() };
        default.sa_sigaction = libc::SIG_DFL;
        // SAFETY: a valid sigaction and the siginfo the kernel passed; sigaction and raise are
        // async-signal-safe.
        unsafe {
            libc::sigaction(signal, &default, ptr::null_mut());
            if (*info).si_code <= 0 {
                libc::raise(signal);
            }
        }
        return;
    }
    let flags = previous.map_or(0, |p| p.sa_flags);
    if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous action asked for the three-argument form; we pass what the
        // kernel passed us.
        let previous = unsafe {
            std::mem::transmute::<
                libc::sighandler_t,
                extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void),
            >(handler)
        };
        previous(signal, info, context);
    } else {
        // SAFETY: a one-argument handler, as the previous action said.
        let previous = unsafe {
            std::mem::transmute::<libc::sighandler_t, extern "C" fn(libc::c_int)>(handler)
        };
        previous(signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_reused_and_found_only_while_registered() {
        let _serial = TEST_GUARDS.lock().unwrap_or_else(|p| p.into_inner());
        let a = guard(0x1000 as *const u8, 0x3000).unwrap();
        assert!(std::ptr::eq(find(0x2fff).unwrap(), a.entry));
        assert!(find(0x4000).is_none() && find(0xfff).is_none());
        let entry = ptr::from_ref(a.entry);
        drop(a);
        assert!(find(0x2000).is_none());
        let b = guard(0x9000 as *const u8, 0x1000).unwrap();
        // No other guard is live (TEST_GUARDS), so `a`'s entry was the newest free one.
        assert!(std::ptr::eq(b.entry, entry), "the freed entry is reused");
        assert!(std::ptr::eq(find(0x9000).unwrap(), b.entry));
        assert_eq!(b.faults(), 0);
    }
}
