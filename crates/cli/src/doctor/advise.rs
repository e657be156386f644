//! Advice in plain words, computed from the report's numbers: each rule a function of the few
//! numbers it needs, so that it can be tested without the machine it describes.

use pinfeed::DEFAULT_PINNED_BUDGET;

use super::probe::link_gbps;
use super::render::{binary, mb, ms, times};
use super::{Link, ReadRate, Report, MEANINGFUL_READ};

/// What page-locking each batch costs against copying it (pin_memory() per batch vs pinfeed).
fn pin_advice(lock_ms: f64, copy_ms: f64, bytes: usize, how: &str, copy: &str) -> String {
    format!(
        "page-locking a {} batch costs {} here ({how}), what pin_memory() does for every batch; \
         {copy} takes {}: {} longer. pinfeed page-locks once.",
        mb(bytes),
        ms(lock_ms),
        ms(copy_ms),
        times(lock_ms / copy_ms.max(1e-9)),
    )
}

/// Registering existing memory against allocating page-locked memory.
fn register_advice(register_ms: f64, host_alloc_ms: f64, bytes: usize) -> String {
    if register_ms < host_alloc_ms {
        format!(
            "registering {} of memory that already exists and unregistering it costs {}, {} \
             less than cuMemHostAlloc and cuMemFreeHost's {}: pinfeed's default --pin-method \
             register is the right one here.",
            mb(bytes),
            ms(register_ms),
            times(host_alloc_ms / register_ms.max(1e-9)),
            ms(host_alloc_ms),
        )
    } else {
        format!(
            "cuMemHostAlloc and cuMemFreeHost of {} ({}) are no slower than registering and \
             unregistering it ({}) here: --pin-method hostalloc costs nothing extra.",
            mb(bytes),
            ms(host_alloc_ms),
            ms(register_ms),
        )
    }
}

fn copy_advice(pageable_gbps: f64, pinned_gbps: f64) -> String {
    if pinned_gbps > pageable_gbps * 1.2 {
        format!(
            "pageable copies run at {pageable_gbps:.1} GB/s, pinned at {pinned_gbps:.1} GB/s \
             (256 MiB copies): feeding the GPU from pinned memory is {} faster.",
            times(pinned_gbps / pageable_gbps.max(1e-9)),
        )
    } else {
        format!(
            "pageable copies run at {pageable_gbps:.1} GB/s, pinned at {pinned_gbps:.1} GB/s \
             (256 MiB copies): pinned memory buys little on this machine.",
        )
    }
}

/// `None` when the limit does not get in the way.
fn memlock_advice(limit: Option<u64>, unlimited: bool, can_exceed: bool) -> Option<String> {
    let limit = limit?;
    if unlimited || can_exceed || limit >= DEFAULT_PINNED_BUDGET as u64 {
        return None;
    }
    Some(format!(
        "the memory-lock limit (RLIMIT_MEMLOCK) is {}, below pinfeed's default pinned budget of \
         {}: raise it with ulimit -l or pinfeed falls back to unlocked memory on the host backend.",
        binary(limit),
        binary(DEFAULT_PINNED_BUDGET as u64),
    ))
}

/// The link as it runs against what it could do, and the copy rate against the link.
fn link_advice(link: &Link, pinned_gbps: Option<f64>) -> Vec<String> {
    let mut out = Vec::new();
    let (running, when) = match &link.under_load {
        Some(state) => (state, "during copies"),
        None => (&link.current, "at rest"),
    };
    if let (Some(g), Some(w), Some(mg), Some(mw)) =
        (running.gen, running.width, link.max.gen, link.max.width)
    {
        if g < mg || w < mw {
            let idle = if link.under_load.is_none() {
                " (GPUs slow an idle link down to save power; a busy one should train up)"
            } else {
                ": check the slot, riser or BIOS setting, since the GPU's copies are held to the slower link"
            };
            out.push(format!(
                "the GPU's PCIe link runs at Gen{g} x{w} {when}, below the Gen{mg} x{mw} it supports{idle}."
            ));
        }
        if let (Some(pinned), Some(line)) = (pinned_gbps, link_gbps(g, w)) {
            if link.under_load.is_some() && pinned < 0.6 * line {
                out.push(format!(
                    "pinned copies reach {pinned:.1} GB/s of the {line:.1} GB/s a Gen{g} x{w} link \
                     carries: something else shares the link, or the IOMMU or a virtual machine \
                     slows DMA down."
                ));
            }
        }
    }
    out
}

fn numa_advice(nodes: Option<usize>, gpu_node: Option<u32>, cpus: Option<&str>) -> Option<String> {
    let nodes = nodes?;
    let node = gpu_node?;
    if nodes < 2 {
        return None;
    }
    let cpus = cpus.map(|c| format!(" (CPUs {c})")).unwrap_or_default();
    Some(format!(
        "this machine has {nodes} NUMA nodes and the GPU hangs off node {node}{cpus}: run under \
         `numactl --cpunodebind={node} --membind={node}` so the pinned pool and the reader \
         threads sit beside it."
    ))
}

/// What the file's rates say. `disk` is the rate from disk (O_DIRECT, or a cold buffered pass),
/// `cached` from the page cache; `gpu_gbps` the pinned copy rate when there is a GPU.
fn disk_advice(
    size: u64,
    disk: Option<f64>,
    cached: Option<f64>,
    mem_available: Option<u64>,
    gpu_gbps: Option<f64>,
) -> Vec<String> {
    let mut out = Vec::new();
    if let (Some(d), Some(c)) = (disk, cached) {
        if d < 0.5 * c {
            out.push(format!(
                "your file reads at {d:.1} GB/s from disk but {c:.1} GB/s when cached: the disk \
                 is the bottleneck for cold epochs."
            ));
        } else {
            out.push(format!(
                "your file reads at {d:.1} GB/s from disk and {c:.1} GB/s when cached: the disk \
                 keeps up with the page cache."
            ));
        }
    }
    if let (Some(d), Some(g)) = (disk, gpu_gbps) {
        if d < g {
            out.push(format!(
                "from disk the file feeds at most {d:.1} GB/s, against {g:.1} GB/s the GPU takes \
                 from pinned memory."
            ));
        }
    }
    if let Some(available) = mem_available {
        if size <= available {
            if let Some(c) = cached {
                out.push(format!(
                    "the whole file ({}) fits in the page cache ({} available): epochs after the \
                     first can read it at {c:.1} GB/s.",
                    binary(size),
                    binary(available),
                ));
            }
        } else if let Some(d) = disk {
            out.push(format!(
                "the file ({}) is larger than available memory ({}): every epoch reads it from \
                 disk, at {d:.1} GB/s.",
                binary(size),
                binary(available),
            ));
        }
    }
    out
}

/// One buffered reader of the uncached file against O_DIRECT. `None` unless it falls well short.
fn buffered_advice(cold_buffered: f64, direct: f64) -> Option<String> {
    (cold_buffered < 0.5 * direct).then(|| {
        format!(
            "one thread reading the uncached file through the page cache got {cold_buffered:.1} \
             GB/s, against {direct:.1} GB/s with O_DIRECT: the disk gives more than one buffered \
             reader takes; more reader threads (--threads) may get closer to it."
        )
    })
}

fn meaningful(rate: Option<ReadRate>) -> Option<ReadRate> {
    rate.filter(|r| r.bytes >= MEANINGFUL_READ)
}

pub(super) fn advise(r: &Report) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(c) = &r.gpu_copies {
        let b = &c.batch;
        out.push(pin_advice(
            b.host_alloc_ms + b.free_host_ms,
            b.pinned_copy_ms,
            b.bytes,
            "cuMemHostAlloc and cuMemFreeHost",
            "copying it to the GPU from pinned memory",
        ));
        out.push(register_advice(
            b.register_ms + b.unregister_ms,
            b.host_alloc_ms + b.free_host_ms,
            b.bytes,
        ));
        if let (Some(pageable), Some(pinned)) = (c.pageable.last(), c.pinned.last()) {
            out.push(copy_advice(pageable.gbps, pinned.gbps));
        }
    } else if let (Some(lock), Some(unlock)) =
        (r.host_copies.batch_mlock_ms, r.host_copies.batch_munlock_ms)
    {
        out.push(pin_advice(
            lock + unlock,
            r.host_copies.batch_memcpy_ms,
            r.host_copies.batch_bytes,
            "mmap, mlock, munlock and munmap, on the host backend",
            "copying it in memory",
        ));
    }
    let pinned_gbps = r
        .gpu_copies
        .as_ref()
        .and_then(|c| c.pinned.last())
        .map(|p| p.gbps);
    if let Some(gpu) = &r.gpu {
        out.extend(link_advice(&gpu.link, pinned_gbps));
        out.extend(numa_advice(
            r.host.numa_nodes,
            gpu.numa_node,
            gpu.numa_cpus.as_deref(),
        ));
    }
    out.extend(memlock_advice(
        r.host.memlock_bytes,
        r.host.memlock_unlimited,
        r.host.cap_ipc_lock,
    ));
    if let Some(f) = &r.file {
        let disk = meaningful(f.direct)
            .or(meaningful(f.buffered).filter(|b| b.cached_before.is_some_and(|c| c < 0.1)))
            .map(|d| d.gbps);
        let cached = meaningful(f.buffered_again)
            .or(meaningful(f.buffered).filter(|b| b.cached_before.is_some_and(|c| c >= 0.99)))
            .map(|c| c.gbps);
        let cold = meaningful(f.buffered).filter(|b| b.cached_before.is_some_and(|c| c < 0.1));
        if let (Some(cold), Some(direct)) = (cold, meaningful(f.direct)) {
            out.extend(buffered_advice(cold.gbps, direct.gbps));
        }
        out.extend(disk_advice(
            f.size_bytes,
            disk,
            cached,
            r.host.mem_available_bytes,
            pinned_gbps,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::{BatchCost, GpuCopies, Host, LinkState, Rate, BATCH_BYTES, BIG};

    #[test]
    fn pin_advice_compares_locking_with_copying() {
        let text = pin_advice(
            1.76,
            0.05,
            BATCH_BYTES,
            "cuMemHostAlloc and cuMemFreeHost",
            "copying it to the GPU from pinned memory",
        );
        assert!(
            text.starts_with("page-locking a 2.95 MB batch costs 1.76 ms here"),
            "{text}"
        );
        assert!(
            text.contains("copying it to the GPU from pinned memory takes 0.05 ms: 35x longer"),
            "{text}"
        );
        assert!(text.ends_with("pinfeed page-locks once."), "{text}");
    }

    #[test]
    fn register_and_copy_advice_pick_the_winner() {
        let text = register_advice(0.98, 2.14, BATCH_BYTES);
        assert!(
            text.contains(
                "costs 0.98 ms, 2.2x less than cuMemHostAlloc and cuMemFreeHost's 2.14 ms"
            ),
            "{text}"
        );
        assert!(text.contains("--pin-method register"), "{text}");
        assert!(register_advice(3.0, 2.0, BATCH_BYTES).contains("hostalloc"));
        let text = copy_advice(8.1, 55.2);
        assert!(
            text.starts_with("pageable copies run at 8.1 GB/s, pinned at 55.2 GB/s"),
            "{text}"
        );
        assert!(text.contains("6.8x faster"), "{text}");
        assert!(copy_advice(10.0, 10.5).contains("buys little"));
    }

    #[test]
    fn memlock_advice_only_when_it_binds() {
        let text = memlock_advice(Some(8 << 20), false, false).unwrap();
        assert!(
            text.contains("is 8 MiB, below pinfeed's default pinned budget of 256 MiB"),
            "{text}"
        );
        assert!(text.contains(
            "raise it with ulimit -l or pinfeed falls back to unlocked memory on the host backend"
        ));
        assert_eq!(memlock_advice(Some(8 << 20), false, true), None);
        assert_eq!(memlock_advice(None, true, false), None);
        assert_eq!(memlock_advice(Some(1 << 30), false, false), None);
    }

    #[test]
    fn link_advice_names_a_slow_link() {
        let state = |g, w| LinkState {
            speed: None,
            gen: Some(g),
            width: Some(w),
        };
        let mut link = Link {
            sysfs: Some("/sys/bus/pci/devices/0000:3b:00.0".into()),
            current: state(1, 16),
            max: state(5, 16),
            under_load: None,
        };
        let idle = link_advice(&link, None);
        assert_eq!(idle.len(), 1);
        assert!(
            idle[0].contains("Gen1 x16 at rest, below the Gen5 x16"),
            "{idle:?}"
        );
        assert!(idle[0].contains("idle link"), "{idle:?}");
        link.under_load = Some(state(5, 16));
        assert!(link_advice(&link, Some(55.2)).is_empty());
        let slow = link_advice(&link, Some(20.0));
        assert_eq!(slow.len(), 1);
        assert!(
            slow[0].contains("20.0 GB/s of the 63.0 GB/s a Gen5 x16 link"),
            "{slow:?}"
        );
        link.under_load = Some(state(4, 8));
        let narrow = link_advice(&link, Some(14.0));
        assert!(
            narrow[0].contains("Gen4 x8 during copies, below the Gen5 x16"),
            "{narrow:?}"
        );
    }

    #[test]
    fn numa_advice_only_with_several_nodes() {
        let text = numa_advice(Some(2), Some(1), Some("16-31")).unwrap();
        assert!(text.contains("GPU hangs off node 1 (CPUs 16-31)"), "{text}");
        assert!(
            text.contains("numactl --cpunodebind=1 --membind=1"),
            "{text}"
        );
        assert_eq!(numa_advice(Some(1), Some(0), None), None);
        assert_eq!(numa_advice(Some(2), None, None), None);
        assert_eq!(numa_advice(None, Some(1), None), None);
    }

    #[test]
    fn disk_advice_finds_the_bottleneck() {
        let gib = 1u64 << 30;
        let text = disk_advice(4 * gib, Some(1.5), Some(10.0), Some(100 * gib), Some(55.0));
        assert_eq!(
            text[0],
            "your file reads at 1.5 GB/s from disk but 10.0 GB/s when cached: the disk is the \
             bottleneck for cold epochs."
        );
        assert!(
            text[1].contains("at most 1.5 GB/s, against 55.0 GB/s"),
            "{text:?}"
        );
        assert!(text[2].contains("fits in the page cache"), "{text:?}");
        let big = disk_advice(200 * gib, Some(1.5), None, Some(100 * gib), None);
        assert_eq!(big.len(), 1);
        assert!(big[0].contains("larger than available memory"), "{big:?}");
        assert!(disk_advice(gib, None, None, Some(100 * gib), None).is_empty());
        let slow = buffered_advice(0.4, 1.7).unwrap();
        assert!(
            slow.contains("got 0.4 GB/s, against 1.7 GB/s with O_DIRECT"),
            "{slow}"
        );
        assert_eq!(buffered_advice(1.4, 1.7), None);
    }

    #[test]
    fn advice_from_a_whole_report() {
        let report = Report {
            host: Host {
                memlock_bytes: Some(8 << 20),
                ..Host::default()
            },
            gpu_copies: Some(GpuCopies {
                timing: "events",
                pinned: vec![Rate::new(BIG, 4.86)],
                pageable: vec![Rate::new(BIG, 33.1)],
                host_alloc_256mib_ms: 92.0,
                batch: BatchCost {
                    bytes: BATCH_BYTES,
                    host_alloc_ms: 1.4,
                    free_host_ms: 0.36,
                    register_ms: 0.8,
                    unregister_ms: 0.17,
                    pinned_copy_ms: 0.05,
                    pageable_copy_ms: 0.3,
                },
            }),
            ..Report::default()
        };
        let advice = advise(&report);
        assert!(advice[0].contains("costs 1.76 ms"), "{advice:?}");
        assert!(advice[0].contains("35x longer"), "{advice:?}");
        assert!(advice[1].contains("--pin-method register"), "{advice:?}");
        assert!(
            advice[2].contains("pageable copies run at 8.1 GB/s, pinned at 55.2 GB/s"),
            "{advice:?}"
        );
        assert!(advice[3].contains("ulimit -l"), "{advice:?}");
        assert_eq!(advice.len(), 4);
    }
}
