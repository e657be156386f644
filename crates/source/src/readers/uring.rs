//! io_uring: a read cut into `read_size` pieces submitted together, at most `queue_depth` in
//! flight, through the `O_DIRECT` descriptor for aligned reads where the file system allows it.
//!
//! Rings belong to threads (one ring per reading thread and queue depth, kept in a
//! thread-local and closed when the thread exits), so readers never contend for a ring and any
//! number of files share them.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use io_uring::{opcode, types, IoUring};

use super::direct::Direct;
use super::pread::pread_runs;
use super::{FileReader, GatherRun};
use crate::read::read_exact_at;
use crate::{Result, SourceError};

/// Reads on this thread's ring; io_uring was accepted when it was made ([`probe`]).
#[derive(Debug)]
pub(crate) struct Uring {
    /// The `O_DIRECT` descriptor for aligned reads, where the file system allows it.
    direct: Option<Direct>,
    read_size: usize,
    queue_depth: u32,
}

impl Uring {
    pub(crate) fn new(direct: Option<Direct>, read_size: usize, queue_depth: u32) -> Uring {
        Uring {
            direct,
            read_size,
            queue_depth,
        }
    }

    /// Runs `pieces` on this thread's ring, `queue_depth` at a time.
    ///
    /// # Safety
    ///
    /// Every piece's `buf .. buf + len` must be valid for writes, not overlap another piece's,
    /// and not be touched by anything else until this returns.
    unsafe fn uring_read(&self, pieces: Vec<Piece>, file: &File, path: &Path) -> Result<()> {
        let mut ring = match take_ring(self.queue_depth) {
            Ok(ring) => ring,
            // Another ring refused after the first was accepted (a limit on rings or locked
            // memory): this read still succeeds, through pread.
            Err(_) => {
                for p in &pieces {
                    // SAFETY: valid for writes and exclusively ours (the caller's contract).
                    let dst = unsafe { std::slice::from_raw_parts_mut(p.buf, p.need) };
                    read_exact_at(file, path, p.offset, dst)?;
                }
                return Ok(());
            }
        };
        let mut run = Run {
            ring: &mut ring,
            pieces,
            depth: self.queue_depth as usize,
            file,
            path,
            align: self.alignment(),
        };
        let outcome = run.go();
        // `go` returns only with nothing in flight and the submission queue empty.
        give_ring(self.queue_depth, ring);
        outcome
    }
}

impl FileReader for Uring {
    fn describe(&self) -> String {
        format!(
            "io_uring (depth {}{})",
            self.queue_depth,
            if self.direct.is_some() {
                ", O_DIRECT"
            } else {
                ""
            }
        )
    }

    fn alignment(&self) -> usize {
        self.direct.as_ref().map_or(1, Direct::alignment)
    }

    /// Fills `dst` from byte `offset` of `file` through the ordinary descriptor: one `pread`, or
    /// `read_size` pieces on io_uring.
    fn read(&self, file: &File, path: &Path, offset: u64, dst: &mut [u8]) -> Result<()> {
        // One piece gains nothing from a queue: a plain pread costs one system call too.
        if dst.len() <= self.read_size {
            return read_exact_at(file, path, offset, dst);
        }
        let fd = file.as_raw_fd();
        let base = dst.as_mut_ptr();
        let pieces = (0..dst.len())
            .step_by(self.read_size)
            .map(|at| {
                let len = self.read_size.min(dst.len() - at);
                Piece {
                    fd,
                    // `at < dst.len()`, so this stays inside `dst`.
                    buf: base.wrapping_add(at),
                    offset: offset + at as u64,
                    len,
                    need: len,
                    done: 0,
                    direct: false,
                }
            })
            .collect();
        // SAFETY: the pieces cover disjoint parts of `dst`, which is exclusively borrowed for
        // this call, and `uring_read` returns only once no read is in flight.
        unsafe { self.uring_read(pieces, file, path) }
    }

    /// `queue_depth` reads in flight, one system call per `queue_depth` records instead of one
    /// per record. The runs' destinations are checked not to overlap: the kernel writes them.
    fn gather(
        &self,
        file: &File,
        path: &Path,
        _data: std::ops::Range<u64>,
        runs: &[GatherRun],
        dst: &mut [u8],
    ) -> Result<()> {
        if runs.len() < 2 {
            return pread_runs(file, path, runs, dst);
        }
        // The kernel writes the pieces: they must not overlap. Runs come in the order of their
        // places (`crate::gather_runs`), so this is one pass.
        let disjoint = runs.windows(2).all(|w| w[0].at + w[0].len <= w[1].at)
            && runs.last().is_none_or(|r| r.at + r.len <= dst.len());
        assert!(disjoint, "gather runs overlap or leave the destination");
        let fd = file.as_raw_fd();
        let base = dst.as_mut_ptr();
        let mut pieces = Vec::with_capacity(runs.len());
        for &GatherRun { offset, at, len } in runs {
            let mut done = 0;
            // Runs longer than `read_size` are cut as `read` cuts them.
            while done < len {
                let piece = self.read_size.min(len - done);
                pieces.push(Piece {
                    fd,
                    // `at + done < at + len <= dst.len()` (checked above).
                    buf: base.wrapping_add(at + done),
                    offset: offset + done as u64,
                    len: piece,
                    need: piece,
                    done: 0,
                    direct: false,
                });
                done += piece;
            }
        }
        // SAFETY: the pieces cover disjoint parts of `dst` (checked above), exclusively
        // borrowed for this call, and `uring_read` returns only once no read is in flight.
        unsafe { self.uring_read(pieces, file, path) }
    }

    /// Without `O_DIRECT` the bytes go to `buf[..len]` and the answer is 0. With it, the
    /// enclosing aligned span is read into `buf` through the direct descriptor, in
    /// `read_size` pieces, and the answer is `offset % align`.
    fn read_aligned(
        &self,
        file: &File,
        path: &Path,
        offset: u64,
        len: usize,
        buf: &mut [u8],
    ) -> Result<usize> {
        let Some(direct) = &self.direct else {
            self.read(file, path, offset, &mut buf[..len])?;
            return Ok(0);
        };
        let (start, lead, need, span) = direct.span(offset, len);
        let align = direct.alignment();
        debug_assert!(buf.len() >= span && buf.as_ptr() as usize % align == 0);
        let buf = &mut buf[..span];
        if len == 0 {
            return Ok(lead);
        }
        // As in `read`: one piece is one pread.
        if span <= self.read_size {
            direct.read_span(file, path, start, buf, need)?;
            return Ok(lead);
        }
        let piece = self.read_size.div_ceil(align) * align;
        let fd = direct.file().as_raw_fd();
        let base = buf.as_mut_ptr();
        let pieces = (0..span)
            .step_by(piece)
            .map(|at| Piece {
                fd,
                // `at < span <= buf.len()`.
                buf: base.wrapping_add(at),
                offset: start + at as u64,
                len: piece.min(span - at),
                // Every piece starts before `need`: the span ends less than one alignment
                // (at most one piece) past it.
                need: piece.min(need - at),
                done: 0,
                direct: true,
            })
            .collect();
        // SAFETY: the pieces cover disjoint parts of `buf`, exclusively borrowed for this call,
        // and `uring_read` returns only once no read is in flight.
        unsafe { self.uring_read(pieces, file, path)? };
        Ok(lead)
    }
}

thread_local! {
    /// This thread's idle rings, by queue depth.
    static RINGS: RefCell<Vec<(u32, IoUring)>> = const { RefCell::new(Vec::new()) };
}

fn take_ring(depth: u32) -> io::Result<IoUring> {
    let idle = RINGS.with_borrow_mut(|rings| {
        let i = rings.iter().position(|(d, _)| *d == depth)?;
        Some(rings.swap_remove(i).1)
    });
    match idle {
        Some(ring) => Ok(ring),
        // The completion queue is twice the submission queue, so `depth` reads in flight can
        // never overflow it.
        None => IoUring::new(depth),
    }
}

fn give_ring(depth: u32, ring: IoUring) {
    RINGS.with_borrow_mut(|rings| rings.push((depth, ring)));
}

/// Creates this thread's ring and reads one byte through it: the kernel may accept
/// `io_uring_setup` and still lack the read opcode (before 5.6).
pub(crate) fn probe(file: &File, depth: u32) -> io::Result<()> {
    let mut ring = take_ring(depth)?;
    let mut byte = 0u8;
    let sqe = opcode::Read::new(types::Fd(file.as_raw_fd()), &mut byte, 1)
        .offset(0)
        .build();
    // SAFETY: `byte` outlives the read: we wait for its completion below before returning.
    unsafe { ring.submission().push(&sqe) }.map_err(io::Error::other)?;
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Nothing was submitted; the ring is dropped with its entry unsubmitted.
            Err(e) => return Err(e),
        }
    }
    let res = ring.completion().next().map_or(-libc::EIO, |c| c.result());
    give_ring(depth, ring);
    if res < 0 {
        return Err(io::Error::from_raw_os_error(-res));
    }
    Ok(())
}

/// One io_uring read: `need` bytes (at least) of `len` into `buf` from `offset`.
struct Piece {
    fd: i32,
    buf: *mut u8,
    offset: u64,
    /// Bytes asked for: a multiple of the alignment for direct pieces.
    len: usize,
    /// Bytes that must arrive; `0 < need <= len`. Less than `len` only for the last direct
    /// piece, whose aligned length may run past the end of the file.
    need: usize,
    /// Bytes that arrived; `done < need` while the piece is queued or in flight.
    done: usize,
    /// Through the `O_DIRECT` descriptor: continued through the buffered one if a short read
    /// leaves it off the alignment.
    direct: bool,
}

/// A batch of pieces on one ring.
struct Run<'a> {
    ring: &'a mut IoUring,
    pieces: Vec<Piece>,
    depth: usize,
    /// The ordinary descriptor, for finishing direct pieces that end off the alignment.
    file: &'a File,
    path: &'a Path,
    align: usize,
}

impl Run<'_> {
    /// Submits every piece, `depth` in flight at a time, and returns once none is in flight:
    /// the first error, after the reads already submitted have completed.
    fn go(&mut self) -> Result<()> {
        let mut queue: std::collections::VecDeque<usize> = (0..self.pieces.len()).collect();
        let mut in_flight = 0usize;
        let mut failed: Option<SourceError> = None;
        loop {
            while failed.is_none() && in_flight < self.depth {
                let Some(i) = queue.pop_front() else { break };
                let p = &self.pieces[i];
                let sqe = opcode::Read::new(
                    types::Fd(p.fd),
                    p.buf.wrapping_add(p.done),
                    // At most `read_size`, which is at most 1 GiB.
                    (p.len - p.done) as u32,
                )
                .offset(p.offset + p.done as u64)
                .build()
                .user_data(i as u64);
                // SAFETY: the buffer stays valid and untouched until the piece completes
                // (`uring_read`'s contract), and we do not return before it has.
                if unsafe { self.ring.submission().push(&sqe) }.is_err() {
                    // Full: submit what is queued first.
                    queue.push_front(i);
                    break;
                }
                in_flight += 1;
            }
            if in_flight == 0 {
                return failed.map_or(Ok(()), Err);
            }
            self.enter(in_flight);
            let done: Vec<(usize, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data() as usize, c.result()))
                .collect();
            for (i, res) in done {
                in_flight -= 1;
                if let Err(e) = self.complete(i, res, &mut queue) {
                    failed.get_or_insert(e);
                }
            }
        }
    }

    /// Submits what is queued and waits for at least one completion.
    ///
    /// Reads may be in flight into the caller's memory, so giving up here could let the kernel
    /// write into memory the caller has reused: errors other than the transient ones (which
    /// `io_uring_enter` with a valid ring does not return) abort the process instead.
    fn enter(&mut self, in_flight: usize) {
        let mut failures = 0;
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => return,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) && failures < 1000 =>
                {
                    failures += 1;
                    std::thread::yield_now();
                }
                Err(e) => {
                    eprintln!(
                        "pinfeed: io_uring_enter failed with {in_flight} reads of {} in flight: {e}",
                        crate::escape_path(self.path)
                    );
                    std::process::abort();
                }
            }
        }
    }

    /// Accounts for one completion: done, queued again for the rest, or an error.
    fn complete(
        &mut self,
        i: usize,
        res: i32,
        queue: &mut std::collections::VecDeque<usize>,
    ) -> Result<()> {
        let Some(p) = self.pieces.get_mut(i) else {
            return Ok(());
        };
        if res < 0 {
            if matches!(-res, libc::EINTR | libc::EAGAIN) {
                queue.push_back(i);
                return Ok(());
            }
            return Err(SourceError::Read {
                path: self.path.to_path_buf(),
                offset: p.offset + p.done as u64,
                len: p.len - p.done,
                source: io::Error::from_raw_os_error(-res),
            });
        }
        if res == 0 {
            return Err(super::direct::truncated(
                self.path, p.offset, p.need, p.done,
            ));
        }
        p.done += res as usize;
        if p.done >= p.need {
            return Ok(());
        }
        if p.direct && p.done % self.align != 0 {
            // SAFETY: `done < need <= len`: inside this piece's buffer, which is ours until we
            // return (`uring_read`'s contract) and has no read in flight now.
            let rest = unsafe {
                std::slice::from_raw_parts_mut(p.buf.wrapping_add(p.done), p.need - p.done)
            };
            return read_exact_at(self.file, self.path, p.offset + p.done as u64, rest);
        }
        queue.push_back(i);
        Ok(())
    }
}
