//! Which ranged GETs fill a read: the bytes wanted, cut into parts of the caller's buffer,
//! grouped into requests of bounded size that coalesce neighbouring ranges.

use pinfeed_source::GatherRun;

/// Bytes of an object that go to one place of the caller's buffer (a slot).
#[derive(Debug)]
pub(crate) struct Part<'a> {
    /// Byte offset in the object of `dst[0]`.
    pub(crate) offset: u64,
    /// Where the bytes go.
    pub(crate) dst: &'a mut [u8],
}

impl Part<'_> {
    fn end(&self) -> u64 {
        self.offset + self.dst.len() as u64
    }
}

/// One ranged GET: bytes `start .. end` of an object, and the parts they fill.
#[derive(Debug)]
pub(crate) struct Request<'a> {
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// Sorted by offset; each lies inside `start .. end`. Two may cover the same bytes (a
    /// record gathered twice); bytes between them are received and dropped.
    pub(crate) parts: Vec<Part<'a>>,
    /// Index of the first part not yet filled: every part before it ends at or before the
    /// bytes received so far.
    open: usize,
}

impl Request<'_> {
    /// Copies `chunk`, the object's bytes from `at`, into every part it overlaps. Chunks
    /// arrive in order, so parts ending before `at` are done and skipped.
    pub(crate) fn fill(&mut self, at: u64, chunk: &[u8]) {
        debug_assert!(at >= self.start && at + chunk.len() as u64 <= self.end);
        let end = at + chunk.len() as u64;
        while self.parts.get(self.open).is_some_and(|p| p.end() <= at) {
            self.open += 1;
        }
        for part in &mut self.parts[self.open..] {
            if part.offset >= end {
                break;
            }
            let lo = part.offset.max(at);
            let hi = part.end().min(end);
            if lo < hi {
                let (from, to) = ((lo - at) as usize, (lo - part.offset) as usize);
                let n = (hi - lo) as usize;
                part.dst[to..to + n].copy_from_slice(&chunk[from..from + n]);
            }
        }
    }

    /// Bytes in the range.
    pub(crate) fn len(&self) -> u64 {
        self.end - self.start
    }
}

/// The parts of `dst` that `runs` fill (`runs` in increasing, non-overlapping places of `dst`,
/// as `pinfeed_source::gather_runs_at` returns them).
pub(crate) fn parts_of<'a>(runs: &[GatherRun], dst: &'a mut [u8]) -> Vec<Part<'a>> {
    let mut parts = Vec::with_capacity(runs.len());
    let mut rest = dst;
    let mut base = 0usize;
    for run in runs {
        debug_assert!(run.at >= base);
        let tail = std::mem::take(&mut rest);
        let (_, from_run) = tail.split_at_mut(run.at - base);
        let (this, after) = from_run.split_at_mut(run.len);
        parts.push(Part {
            offset: run.offset,
            dst: this,
        });
        rest = after;
        base = run.at + run.len;
    }
    parts
}

/// Groups `parts` into requests: parts longer than `max` bytes are cut, then parts are
/// sorted by offset and a part joins the request before it when it starts at most `gap`
/// bytes after that request's end and the request stays within `max` bytes.
pub(crate) fn plan(parts: Vec<Part<'_>>, max: usize, gap: u64) -> Vec<Request<'_>> {
    let max = max.max(1);
    let mut cut: Vec<Part<'_>> = Vec::with_capacity(parts.len());
    for part in parts {
        let mut offset = part.offset;
        for piece in part.dst.chunks_mut(max) {
            let len = piece.len() as u64;
            cut.push(Part { offset, dst: piece });
            offset += len;
        }
    }
    cut.sort_by_key(|p| p.offset);
    let mut requests: Vec<Request<'_>> = Vec::new();
    for part in cut {
        let end = part.end();
        match requests.last_mut() {
            Some(r)
                if part.offset <= r.end.saturating_add(gap)
                    && end.max(r.end) - r.start <= max as u64 =>
            {
                r.end = r.end.max(end);
                r.parts.push(part);
            }
            _ => requests.push(Request {
                start: part.offset,
                end,
                parts: vec![part],
                open: 0,
            }),
        }
    }
    requests
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fills `dst` from `object` through `plan`, delivering each request's bytes in `chunk`
    /// pieces, and returns the requests' ranges.
    fn run(
        object: &[u8],
        runs: &[GatherRun],
        dst: &mut [u8],
        max: usize,
        gap: u64,
        chunk: usize,
    ) -> Vec<(u64, u64)> {
        let mut requests = plan(parts_of(runs, dst), max, gap);
        let ranges = requests.iter().map(|r| (r.start, r.end)).collect();
        for r in &mut requests {
            let body = &object[r.start as usize..r.end as usize];
            let mut at = r.start;
            for piece in body.chunks(chunk) {
                r.fill(at, piece);
                at += piece.len() as u64;
            }
        }
        ranges
    }

    fn run_at(offset: u64, at: usize, len: usize) -> GatherRun {
        GatherRun { offset, at, len }
    }

    #[test]
    fn neighbours_coalesce_and_large_ranges_are_cut() {
        let object: Vec<u8> = (0..=255).cycle().take(4096).map(|b| b as u8).collect();
        // Records of 16 bytes: 10, 11 (one run), 13 (gap of one record), 200, then 10 again.
        let runs = [
            run_at(160, 0, 32),
            run_at(208, 32, 16),
            run_at(3200, 48, 16),
            run_at(160, 64, 16),
        ];
        let mut dst = vec![0u8; 80];
        let ranges = run(&object, &runs, &mut dst, 1024, 16, 7);
        assert_eq!(ranges, vec![(160, 224), (3200, 3216)]);
        let mut want = object[160..192].to_vec();
        want.extend(&object[208..224]);
        want.extend(&object[3200..3216]);
        want.extend(&object[160..176]);
        assert_eq!(dst, want);

        // Without a gap allowed the hole splits them; a small maximum cuts one range in three.
        let mut dst = vec![0u8; 80];
        assert_eq!(
            run(&object, &runs, &mut dst, 1024, 0, 5),
            vec![(160, 192), (208, 224), (3200, 3216)]
        );
        let mut big = vec![0u8; 1000];
        let ranges = run(&object, &[run_at(100, 0, 1000)], &mut big, 400, 0, 64);
        assert_eq!(ranges, vec![(100, 500), (500, 900), (900, 1100)]);
        assert_eq!(big, &object[100..1100]);
    }
}
