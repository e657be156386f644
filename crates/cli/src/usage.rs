//! Process CPU time and machine memory, for the reports.

use std::time::Duration;

/// User plus system CPU time of this process, all threads.
pub fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is valid for writes of one `rusage`; RUSAGE_SELF is always accepted.
    let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } == 0;
    if !ok {
        return Duration::ZERO;
    }
    // SAFETY: getrusage succeeded and filled the struct (it was zeroed before anyway).
    let usage = unsafe { usage.assume_init() };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Bytes of memory available for new allocations, from /proc/meminfo.
pub fn mem_available() -> Option<u64> {
    meminfo_bytes(&read_meminfo(), "MemAvailable")
}

/// The text of /proc/meminfo; empty where there is none.
pub fn read_meminfo() -> String {
    std::fs::read_to_string("/proc/meminfo").unwrap_or_default()
}

/// A `Name:   123 kB` line of /proc/meminfo, in bytes: the one parser of it in the command.
pub fn meminfo_bytes(meminfo: &str, name: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find(|l| l.split(':').next() == Some(name))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Peak resident set size of this process, in bytes.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_lines_parse() {
        let meminfo = "MemTotal:       24684084 kB\nMemFree:  1 kB\nMemAvailable:   24269648 kB\n";
        assert_eq!(meminfo_bytes(meminfo, "MemTotal"), Some(24684084 * 1024));
        assert_eq!(
            meminfo_bytes(meminfo, "MemAvailable"),
            Some(24269648 * 1024)
        );
        assert_eq!(meminfo_bytes(meminfo, "Mem"), None);
    }
}
