//! Host memory page-locked in place.

use super::*;

/// Existing host memory page-locked in place until dropped: `cuMemHostRegister` on CUDA,
/// `mlock` on the host backend.
pub struct PinnedRegion {
    _lock: RegionLock,
    len: usize,
}

pub(super) enum RegionLock {
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
mod pin_limit_tests {
    use super::*;

    #[test]
    pub(super) fn pinning_more_than_half_the_machine_is_refused_with_advice() {
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
