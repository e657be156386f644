//! What the operating system says about this machine: its cores, its memory (the one reader
//! of `/proc/meminfo`) and the free space of a file system.
//!
//! ```
//! // `None` where /proc/meminfo is missing (not Linux) or lacks the field.
//! if let (Some(total), Some(available)) = (pinfeed_source::system::mem_total(), pinfeed_source::system::mem_available()) {
//!     assert!(available <= total);
//! }
//! ```

/// The cores this process may run on (4 where the system does not say).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get())
}

/// Where pinfeed keeps what it caches on this machine: `$PINFEED_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/pinfeed`, else `~/.cache/pinfeed`.
pub fn cache_dir() -> Option<std::path::PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
    };
    env("PINFEED_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("pinfeed")))
        .or_else(|| env("HOME").map(|d| d.join(".cache").join("pinfeed")))
}

/// Bytes of memory the machine has (`MemTotal`).
pub fn mem_total() -> Option<u64> {
    meminfo("MemTotal")
}

/// Bytes of memory available for new allocations without swapping (`MemAvailable`).
pub fn mem_available() -> Option<u64> {
    meminfo("MemAvailable")
}

/// Bytes an unprivileged writer may still use on the file system holding `path` (`statvfs`'s
/// `f_bavail` blocks of `f_frsize` bytes); `None` where the path cannot be asked about.
pub fn free_bytes(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` is valid for one `statvfs` to be written.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: `statvfs` returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    // The fields' types differ between platforms (u32 on some 32-bit targets).
    #[allow(clippy::unnecessary_cast)]
    (st.f_bavail as u64).checked_mul(st.f_frsize as u64)
}

/// A field of `/proc/meminfo`, in bytes (`"MemTotal"`, `"MemAvailable"`, `"Cached"`).
pub fn meminfo(name: &str) -> Option<u64> {
    meminfo_field(&std::fs::read_to_string("/proc/meminfo").ok()?, name)
}

/// Field `name` of text in the format of `/proc/meminfo` (`MemTotal:  16384 kB`), in bytes;
/// `None` when the field is missing or not a number of kB.
pub fn meminfo_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.split(':').next() == Some(name))?;
    let mut words = line.split(':').nth(1)?.split_whitespace();
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => value.checked_mul(1024),
        // Counts such as `HugePages_Total: 0` carry no unit: they are not bytes.
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "MemTotal:       24576000 kB\n\
                          MemFree:         1024000 kB\n\
                          MemAvailable:   12288000 kB\n\
                          SwapCached:            0 kB\n\
                          Cached:          8192000 kB\n\
                          HugePages_Total:       0\n";

    #[test]
    fn fields_are_read_in_bytes() {
        assert_eq!(meminfo_field(SAMPLE, "MemTotal"), Some(24_576_000 * 1024));
        assert_eq!(
            meminfo_field(SAMPLE, "MemAvailable"),
            Some(12_288_000 * 1024)
        );
        // The name must match whole: `Cached` is not `SwapCached`.
        assert_eq!(meminfo_field(SAMPLE, "Cached"), Some(8_192_000 * 1024));
        assert_eq!(meminfo_field(SAMPLE, "Mem"), None);
        assert_eq!(meminfo_field(SAMPLE, "HugePages_Total"), None);
        assert_eq!(meminfo_field("MemTotal: lots kB", "MemTotal"), None);
        assert_eq!(meminfo_field("", "MemTotal"), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn this_machine_reports_its_memory() {
        let total = mem_total().expect("MemTotal");
        let available = mem_available().expect("MemAvailable");
        assert!(
            available > 0 && available <= total,
            "{available} of {total}"
        );
    }
}
