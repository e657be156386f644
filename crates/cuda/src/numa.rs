//! Which NUMA node a GPU hangs off, and placing host memory on it.
//!
//! On a host with several sockets, a DMA from memory on the far socket crosses the socket link,
//! so the pinned pool should live on the GPU's node. The facts come from sysfs: the node count
//! from `/sys/devices/system/node/online`, the GPU's node from
//! `/sys/bus/pci/devices/<bus id>/numa_node` (`-1` when the platform reports none). A missing
//! file means no NUMA information, never an error.
//!
//! [`decide`] turns the facts into a [`NumaPlacement`]; [`mbind_preferred`] applies it to a
//! mapping before its pages are touched (the kernel places a page when it is first faulted in).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where the node list of the host lives.
const NODES_ONLINE: &str = "/sys/devices/system/node/online";

/// Where a pinned allocation's pages were put, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NumaPlacement {
    /// On the GPU's node, bound with `mbind(MPOL_PREFERRED)` (from [`decide`]: the node to bind
    /// to).
    GpuNode(u32),
    /// The host has one node: there is nothing to choose.
    OneNode,
    /// Left where the kernel (or the driver) puts it; the reason in words.
    NotPlaced(String),
}

impl fmt::Display for NumaPlacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NumaPlacement::GpuNode(node) => write!(f, "node {node} (the GPU's)"),
            NumaPlacement::OneNode => f.write_str("no NUMA (one node)"),
            NumaPlacement::NotPlaced(why) => write!(f, "not placed: {why}"),
        }
    }
}

/// What to do with a new mapping, given the host's node count and the GPU's node (either
/// `None` when sysfs does not say).
pub fn decide(nodes: Option<usize>, gpu_node: Option<u32>) -> NumaPlacement {
    match (nodes, gpu_node) {
        (None, _) => NumaPlacement::NotPlaced(format!("no NUMA information ({NODES_ONLINE})")),
        (Some(n), _) if n <= 1 => NumaPlacement::OneNode,
        (Some(_), None) => NumaPlacement::NotPlaced("the GPU's NUMA node is unknown".into()),
        (Some(_), Some(node)) => NumaPlacement::GpuNode(node),
    }
}

/// The number of entries in a sysfs list such as `0`, `0-1` or `0,2-3`; `None` when it does not
/// parse.
pub fn list_count(list: &str) -> Option<usize> {
    let list = list.trim();
    if list.is_empty() {
        return Some(0);
    }
    let mut count = 0;
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                count += b.checked_sub(a)? + 1;
            }
            None => {
                part.trim().parse::<usize>().ok()?;
                count += 1;
            }
        }
    }
    Some(count)
}

/// A device's `numa_node` file: `None` for `-1` (no node reported) or text that does not parse.
pub fn parse_numa_node(text: &str) -> Option<u32> {
    text.trim().parse().ok()
}

/// How many NUMA nodes the host has online; `None` without the sysfs file. Read once per
/// process, since every pinned allocation asks (a node brought online later is not seen).
pub fn online_node_count() -> Option<usize> {
    static COUNT: OnceLock<Option<usize>> = OnceLock::new();
    *COUNT.get_or_init(|| list_count(&std::fs::read_to_string(NODES_ONLINE).ok()?))
}

/// The directory name sysfs gives a PCI device, from a CUDA bus id: lower case, a four-digit
/// domain (CUDA may write eight, `00000000:3B:00.0`, or none).
pub fn sysfs_pci_name(bus_id: &str) -> Option<String> {
    let bus_id = bus_id.trim();
    let parts: Vec<&str> = bus_id.split(':').collect();
    let (domain, bus, devfn) = match parts.as_slice() {
        [domain, bus, devfn] => (u32::from_str_radix(domain, 16).ok()?, *bus, *devfn),
        [bus, devfn] => (0, *bus, *devfn),
        _ => return None,
    };
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let (dev, func) = devfn.split_once('.')?;
    let dev = u8::from_str_radix(dev, 16).ok()?;
    let func = u8::from_str_radix(func, 16).ok()?;
    if dev > 0x1f || func > 7 {
        return None;
    }
    Some(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

/// The sysfs directory of the PCI device with CUDA bus id `bus_id`, if there is one.
pub fn pci_device_dir(bus_id: &str) -> Option<PathBuf> {
    let dir = Path::new("/sys/bus/pci/devices").join(sysfs_pci_name(bus_id)?);
    dir.exists().then_some(dir)
}

/// The NUMA node of the PCI device whose sysfs directory is `dir`; `None` when none is reported.
pub fn device_numa_node(dir: &Path) -> Option<u32> {
    parse_numa_node(&std::fs::read_to_string(dir.join("numa_node")).ok()?)
}

/// Sets the memory policy of `len` bytes at `ptr` to `MPOL_PREFERRED` for `node`: pages faulted
/// in afterwards come from that node while it has free memory, and from another node otherwise
/// (so a full node never fails an allocation, unlike `MPOL_BIND`). Pages already present stay
/// where they are.
///
/// `ptr` must be page-aligned; the kernel checks that the range is mapped (`EFAULT` otherwise).
// Safe although it takes a raw pointer: the kernel only looks the range up (and refuses an
// unmapped one); no byte behind `ptr` is read or written, so no caller invariant is at stake.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn mbind_preferred(ptr: *mut u8, len: usize, node: u32) -> io::Result<()> {
    const BITS: usize = libc::c_ulong::BITS as usize;
    let node = node as usize;
    let mut mask: Vec<libc::c_ulong> = vec![0; node / BITS + 1];
    mask[node / BITS] |= 1 << (node % BITS);
    // The kernel reads `maxnode - 1` bits (a historical off-by-one that libnuma also pays).
    let maxnode = mask.len() * BITS + 1;
    // SAFETY: mbind only changes the policy the kernel applies to later page faults in the
    // range; it reads `mask` (valid for `maxnode - 1` bits) and neither reads nor writes the
    // memory at `ptr`, and with no MPOL_MF_* flags moves no page.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            ptr,
            len,
            libc::MPOL_PREFERRED,
            mask.as_ptr(),
            maxnode,
            0u32,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Maps `bytes` of anonymous read-write memory, applies `placement` (binding to the GPU's node
/// before any page is touched), then faults every page in. Returns the mapping and the placement
/// that took effect: a failed `mbind` leaves the memory where the kernel puts it and says why.
pub(crate) fn map_placed(
    bytes: usize,
    placement: NumaPlacement,
) -> io::Result<(memmap2::MmapMut, NumaPlacement)> {
    // No MAP_POPULATE: the pages would be placed before `mbind` could say where, and made
    // small before the advice below could ask for huge ones.
    let mut map = memmap2::MmapOptions::new().len(bytes).map_anon()?;
    // Huge pages where transparent huge pages are `madvise`, as on the GPU machine (an error,
    // as where they are off, leaves small pages). A shuffled batch's readers write thousands of
    // records into a slot of a few MiB, and the copy engine reads it: in 2 MiB pages a slot
    // takes two or three TLB entries instead of hundreds, which shuffled passes gain from most.
    // Every `PinMethod::Register` allocation is mapped here: the loader's pool and the
    // `Stager`'s arena.
    let _ = map.advise(memmap2::Advice::HugePage);
    let placement = match placement {
        NumaPlacement::GpuNode(node) => match mbind_preferred(map.as_mut_ptr(), bytes, node) {
            Ok(()) => NumaPlacement::GpuNode(node),
            Err(e) => NumaPlacement::NotPlaced(format!("mbind to node {node} failed: {e}")),
        },
        other => other,
    };
    populate(&mut map);
    Ok((map, placement))
}

/// Faults in every page of the mapping, so no fault lands on the hot path (what MAP_POPULATE
/// did). `MADV_POPULATE_WRITE` needs Linux 5.14; older kernels answer `EINVAL`, and then each
/// page is written once. Any other failure is left for the caller's registration to report, as
/// MAP_POPULATE's would have been.
fn populate(map: &mut memmap2::MmapMut) {
    match map.advise(memmap2::Advice::PopulateWrite) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
        _ => return,
    }
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096);
    let ptr = map.as_mut_ptr();
    for offset in (0..map.len()).step_by(page) {
        // SAFETY: `offset < len`, inside the mapping borrowed mutably here; writing the zero a
        // fresh page holds changes nothing but faults the page in (volatile, so that the write
        // is not left out).
        unsafe { ptr.add(offset).write_volatile(0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists_parse() {
        assert_eq!(list_count("0"), Some(1));
        assert_eq!(list_count("0-1"), Some(2));
        assert_eq!(list_count("0,2-3"), Some(3));
        assert_eq!(list_count("0-3,8,10-11\n"), Some(7));
        assert_eq!(list_count(""), Some(0));
        assert_eq!(list_count("3-1"), None);
        assert_eq!(list_count("zero"), None);
    }

    #[test]
    fn numa_node_files_parse() {
        assert_eq!(parse_numa_node("1\n"), Some(1));
        assert_eq!(parse_numa_node("0"), Some(0));
        assert_eq!(parse_numa_node("-1\n"), None);
        assert_eq!(parse_numa_node(""), None);
    }

    #[test]
    fn pci_names_follow_sysfs() {
        assert_eq!(
            sysfs_pci_name("00000000:3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(
            sysfs_pci_name("0000:3b:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(sysfs_pci_name("3B:00.0").as_deref(), Some("0000:3b:00.0"));
        assert_eq!(
            sysfs_pci_name("0001:C1:1F.7\n").as_deref(),
            Some("0001:c1:1f.7")
        );
        assert_eq!(sysfs_pci_name("nonsense"), None);
        assert_eq!(sysfs_pci_name("0000:3b:00"), None);
        assert_eq!(sysfs_pci_name("0000:3b:20.0"), None);
    }

    #[test]
    fn placement_needs_several_nodes_and_a_known_gpu_node() {
        assert_eq!(decide(Some(1), Some(0)), NumaPlacement::OneNode);
        assert_eq!(decide(Some(1), None), NumaPlacement::OneNode);
        assert!(matches!(
            decide(Some(2), None),
            NumaPlacement::NotPlaced(why) if why.contains("unknown")
        ));
        assert!(matches!(
            decide(None, Some(1)),
            NumaPlacement::NotPlaced(why) if why.contains("no NUMA information")
        ));
        assert_eq!(decide(Some(2), Some(1)), NumaPlacement::GpuNode(1));
        assert_eq!(decide(Some(8), Some(7)), NumaPlacement::GpuNode(7));
        // What `sysfs` gives on a one-socket host and for a GPU with no node (`-1`).
        assert_eq!(
            decide(list_count("0"), parse_numa_node("0")),
            NumaPlacement::OneNode
        );
        assert!(matches!(
            decide(list_count("0-1"), parse_numa_node("-1")),
            NumaPlacement::NotPlaced(_)
        ));
        assert_eq!(
            decide(list_count("0-1"), parse_numa_node("1")),
            NumaPlacement::GpuNode(1)
        );
    }

    #[test]
    fn placements_read_as_words() {
        assert_eq!(NumaPlacement::GpuNode(1).to_string(), "node 1 (the GPU's)");
        assert_eq!(NumaPlacement::OneNode.to_string(), "no NUMA (one node)");
        assert_eq!(
            NumaPlacement::NotPlaced("why".into()).to_string(),
            "not placed: why"
        );
    }

    /// The calling thread's policy for the page at `ptr` (`get_mempolicy` with `MPOL_F_ADDR`).
    fn policy_at(ptr: *mut u8) -> io::Result<i32> {
        let mut mode: libc::c_int = -1;
        // SAFETY: `mode` is a valid out-pointer; a null node mask with maxnode 0 asks for the
        // mode alone; `ptr` is only looked up.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_get_mempolicy,
                &mut mode as *mut libc::c_int,
                std::ptr::null_mut::<libc::c_ulong>(),
                0usize,
                ptr,
                2u32, // MPOL_F_ADDR
            )
        };
        if rc == 0 {
            Ok(mode)
        } else {
            Err(io::Error::last_os_error())
        }
    }

    #[test]
    fn mbind_prefers_node_zero_on_a_real_mapping() {
        let len = 4 << 20;
        let (mut map, placement) = map_placed(len, NumaPlacement::OneNode).expect("mmap");
        let ptr = map.as_mut_ptr();
        assert_eq!(placement, NumaPlacement::OneNode);
        assert_eq!(policy_at(ptr).expect("get_mempolicy"), libc::MPOL_DEFAULT);
        match mbind_preferred(ptr, len, 0) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                eprintln!("skipped: mbind is not available here: {e}");
            }
            result => {
                result.expect("mbind(MPOL_PREFERRED) to node 0, which always exists");
                assert_eq!(policy_at(ptr).expect("get_mempolicy"), libc::MPOL_PREFERRED);
                // The same through the allocation path: bound before the pages are touched,
                // and the pages are there and zero.
                let (mut placed, placement) =
                    map_placed(len, NumaPlacement::GpuNode(0)).expect("mmap");
                assert_eq!(placement, NumaPlacement::GpuNode(0));
                assert_eq!(
                    policy_at(placed.as_mut_ptr()).expect("get_mempolicy"),
                    libc::MPOL_PREFERRED
                );
                assert!(placed.iter().all(|&b| b == 0));
                placed[len - 1] = 7;
            }
        }
    }
}
