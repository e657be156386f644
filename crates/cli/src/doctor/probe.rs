//! What the machine is, without measuring: host limits and kernel settings, the GPU, its PCIe
//! link and NUMA node. Any fact the system will not give is left out, never fatal.

use std::path::Path;
use std::sync::Arc;

use pinfeed::DeviceSpec;
use pinfeed_cuda::{numa, CUdevice_attribute, Context, CudaError};

use super::{GpuFacts, Host, Link, LinkState};

/// The context to examine, or one line saying why there is none.
pub(super) fn open_gpu(device: DeviceSpec) -> std::result::Result<Arc<Context>, String> {
    let ordinal = match device {
        DeviceSpec::Cpu => return Err("not examined (--device cpu)".into()),
        DeviceSpec::Cuda(n) => n,
        DeviceSpec::Auto => 0,
    };
    let describe = |e: CudaError| match e {
        // The library's list of every name it tried is noise here.
        CudaError::NoDriver { tried, .. } if !tried.is_empty() => {
            "no CUDA driver: libcuda.so.1 could not be loaded (install the NVIDIA driver, or put \
             its libcuda.so.1 on LD_LIBRARY_PATH)"
                .to_owned()
        }
        CudaError::NoDriver { detail, .. } => format!("no CUDA driver: {detail}"),
        other => format!("CUDA unusable: {other}"),
    };
    match pinfeed_cuda::probe() {
        Err(e) => return Err(describe(e)),
        Ok(0) => {
            let version = pinfeed_cuda::driver_version()
                .map(|v| format!(" (CUDA {})", cuda_version(v)))
                .unwrap_or_default();
            return Err(format!("a CUDA driver{version} but no CUDA device"));
        }
        Ok(_) => {}
    }
    Context::new(ordinal).map_err(describe)
}

pub(super) fn host_facts() -> Host {
    let (memlock_bytes, memlock_unlimited) = memlock_limit();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    Host {
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        mem_total_bytes: pinfeed::system::mem_total(),
        mem_available_bytes: pinfeed::system::mem_available(),
        memlock_bytes,
        memlock_unlimited,
        // SAFETY: geteuid has no preconditions and cannot fail.
        root: unsafe { libc::geteuid() } == 0,
        cap_ipc_lock: has_capability(&status, CAP_IPC_LOCK),
        transparent_hugepages: read_trimmed("/sys/kernel/mm/transparent_hugepage/enabled")
            .and_then(|s| bracketed(&s).map(str::to_owned)),
        free_page_reporting: free_page_reporting(Path::new(BALLOON_DRIVER)),
        numa_nodes: numa::online_node_count(),
    }
}

/// Where the virtio-balloon driver lists its devices (`virtio0`, ...).
const BALLOON_DRIVER: &str = "/sys/bus/virtio/drivers/virtio_balloon";

/// `VIRTIO_BALLOON_F_REPORTING`: the guest reports the pages it frees, and the host takes them.
const BALLOON_F_REPORTING: usize = 5;

/// Whether a balloon device under `driver` negotiated free page reporting: its `features` file
/// is one character per feature bit, bit 0 first. `None` when there is no virtio-balloon device.
fn free_page_reporting(driver: &Path) -> Option<bool> {
    let devices = std::fs::read_dir(driver).ok()?;
    let mut any = None;
    for device in devices.flatten() {
        if !device.file_name().to_string_lossy().starts_with("virtio") {
            continue;
        }
        let Some(features) = read_trimmed(device.path().join("features")) else {
            continue;
        };
        let on = features.as_bytes().get(BALLOON_F_REPORTING) == Some(&b'1');
        any = Some(any.unwrap_or(false) || on);
    }
    any
}

/// `(soft limit, unlimited)`; `(None, false)` when getrlimit fails.
fn memlock_limit() -> (Option<u64>, bool) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid out-pointer for one rlimit; RLIMIT_MEMLOCK is always accepted.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return (None, false);
    }
    if limit.rlim_cur == libc::RLIM_INFINITY {
        (None, true)
    } else {
        // rlim_t is narrower than u64 on some targets.
        #[allow(clippy::unnecessary_cast)]
        let soft = limit.rlim_cur as u64;
        (Some(soft), false)
    }
}

const CAP_IPC_LOCK: u32 = 14;

/// Whether the `CapEff:` mask of a /proc/PID/status text has capability `bit`.
fn has_capability(status: &str, bit: u32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << bit) != 0)
}

/// The selected word of a sysfs choice list (`always [madvise] never` gives `madvise`).
fn bracketed(text: &str) -> Option<&str> {
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(&text[start..end])
}

fn read_trimmed(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// `13000` as `13.0`, `12080` as `12.8`.
fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The PCIe generation of a sysfs link speed (`16.0 GT/s PCIe`, or `8 GT/s` on old kernels).
fn pcie_gen(speed: &str) -> Option<u32> {
    let gts: f64 = speed.split_whitespace().next()?.parse().ok()?;
    let gens = [
        (2.5, 1),
        (5.0, 2),
        (8.0, 3),
        (16.0, 4),
        (32.0, 5),
        (64.0, 6),
        (128.0, 7),
    ];
    gens.iter()
        .find(|(rate, _)| (gts - rate).abs() < 0.01)
        .map(|&(_, gen)| gen)
}

/// What a link moves per direction, in GB/s, before packet overhead: the encoding is 8b/10b up
/// to Gen2, 128b/130b for Gen3 to Gen5, and (roughly) 242 of 256 bytes a flit from Gen6.
pub(super) fn link_gbps(gen: u32, width: u32) -> Option<f64> {
    let per_lane = match gen {
        1 => 2.5 * 0.8,
        2 => 5.0 * 0.8,
        3 => 8.0 * 128.0 / 130.0,
        4 => 16.0 * 128.0 / 130.0,
        5 => 32.0 * 128.0 / 130.0,
        6 => 64.0 * 242.0 / 256.0,
        7 => 128.0 * 242.0 / 256.0,
        _ => return None,
    };
    Some(per_lane / 8.0 * f64::from(width))
}

pub(super) fn link_state(dir: &Path, prefix: &str) -> LinkState {
    let speed = read_trimmed(dir.join(format!("{prefix}_link_speed")));
    LinkState {
        gen: speed.as_deref().and_then(pcie_gen),
        speed,
        width: read_trimmed(dir.join(format!("{prefix}_link_width"))).and_then(|w| w.parse().ok()),
    }
}

/// Everything about the device that does not need a measurement. Any fact the driver or sysfs
/// will not give is left out, not fatal.
pub(super) fn gpu_facts(ctx: &Arc<Context>) -> GpuFacts {
    let attr = |a| ctx.attribute(a).ok();
    let cc = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR).zip(attr(
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
    ));
    let mem = ctx.mem_info().ok();
    let pci_bus_id = ctx.pci_bus_id().ok();
    let sysfs = pci_bus_id.as_deref().and_then(numa::pci_device_dir);
    let (link, numa_node, numa_cpus) = match &sysfs {
        Some(dir) => (
            Link {
                sysfs: Some(dir.display().to_string()),
                current: link_state(dir, "current"),
                max: link_state(dir, "max"),
                under_load: None,
            },
            numa::device_numa_node(dir),
            read_trimmed(dir.join("local_cpulist")),
        ),
        None => (Link::default(), None, None),
    };
    GpuFacts {
        ordinal: ctx.ordinal(),
        name: ctx.name().unwrap_or_else(|_| "unknown".into()),
        cuda_version: pinfeed_cuda::driver_version().ok().map(cuda_version),
        kernel_driver: read_trimmed("/sys/module/nvidia/version"),
        compute_capability: cc.map(|(major, minor)| format!("{major}.{minor}")),
        memory_total_bytes: mem.map(|(_, total)| total as u64),
        memory_free_bytes: mem.map(|(free, _)| free as u64),
        pci_bus_id,
        copy_engines: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT),
        link,
        numa_node,
        numa_cpus,
    }
}

/// Times single host-to-device copies, with timing events when the driver has them.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_speeds_give_generations() {
        assert_eq!(pcie_gen("32.0 GT/s PCIe"), Some(5));
        assert_eq!(pcie_gen("16.0 GT/s PCIe"), Some(4));
        assert_eq!(pcie_gen("8 GT/s"), Some(3));
        assert_eq!(pcie_gen("2.5 GT/s PCIe"), Some(1));
        assert_eq!(pcie_gen("Unknown"), None);
        assert_eq!(pcie_gen(""), None);
        let gen5 = link_gbps(5, 16).unwrap();
        assert!((gen5 - 63.0).abs() < 0.1, "{gen5}");
        let gen3 = link_gbps(3, 16).unwrap();
        assert!((gen3 - 15.75).abs() < 0.1, "{gen3}");
    }

    #[test]
    fn free_page_reporting_is_bit_five_of_a_balloon_device() {
        let dir = std::env::temp_dir().join(format!("pinfeed-balloon-{}", std::process::id()));
        let device = dir.join("virtio3");
        std::fs::create_dir_all(&device).unwrap();
        std::fs::write(dir.join("uevent"), "").unwrap();
        assert_eq!(free_page_reporting(&dir), None, "no device yet");
        std::fs::write(device.join("features"), "0110010100000000\n").unwrap();
        assert_eq!(free_page_reporting(&dir), Some(true));
        std::fs::write(device.join("features"), "0110000100000000\n").unwrap();
        assert_eq!(free_page_reporting(&dir), Some(false));
        assert_eq!(free_page_reporting(&dir.join("absent")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn kernel_texts_parse() {
        assert_eq!(bracketed("always [madvise] never"), Some("madvise"));
        assert_eq!(bracketed("always madvise never"), None);
        assert!(has_capability("CapEff:\t000001fffeffffff\n", CAP_IPC_LOCK));
        assert!(!has_capability("CapEff:\t00000000a80425fb\n", CAP_IPC_LOCK));
        assert!(!has_capability("", CAP_IPC_LOCK));
        assert_eq!(cuda_version(13000), "13.0");
        assert_eq!(cuda_version(12080), "12.8");
    }
}
