//! The report as text: one section each for the host, the GPU, the measurements, the file and
//! the advice, values in one column.

use std::path::Path;

use super::{FileReport, Host, LinkState, Rate, ReadRate, Report, BATCH_BYTES, MEANINGFUL_READ};

pub(super) fn ms(x: f64) -> String {
    if x < 0.01 {
        format!("{:.1} µs", x * 1e3)
    } else if x >= 100.0 {
        format!("{x:.0} ms")
    } else if x >= 10.0 {
        format!("{x:.1} ms")
    } else {
        format!("{x:.2} ms")
    }
}

pub(super) fn times(ratio: f64) -> String {
    if ratio >= 10.0 {
        format!("{ratio:.0}x")
    } else {
        format!("{ratio:.1}x")
    }
}

pub(super) fn mb(bytes: usize) -> String {
    format!("{:.2} MB", bytes as f64 / 1e6)
}

/// `8 MiB`, `125.0 GiB`: binary units for memory sizes and limits.
pub(super) fn binary(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 || value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn opt<T>(value: Option<T>, show: impl FnOnce(T) -> String) -> String {
    value.map_or_else(|| "unknown".into(), show)
}

fn link_text(state: &LinkState) -> String {
    match (state.gen, state.width, &state.speed) {
        (Some(g), Some(w), _) => format!("Gen{g} x{w}"),
        (None, Some(w), Some(s)) => format!("{s} x{w}"),
        (_, None, Some(s)) => s.clone(),
        _ => "unknown".into(),
    }
}

/// One `  label   value` line, values in one column.
fn line(s: &mut String, label: &str, value: impl std::fmt::Display) {
    s.push_str(&format!("  {label:<28}{value}\n"));
}

pub(super) fn render(r: &Report, path: Option<&Path>) -> String {
    let mut s = String::new();
    render_host(&mut s, &r.host);
    render_gpu(&mut s, r);
    render_measurements(&mut s, r);
    if let Some(f) = &r.file {
        render_file(&mut s, f, path);
    }
    if !r.advice.is_empty() {
        s.push_str("advice\n");
        for a in &r.advice {
            s.push_str(&format!("  - {a}\n"));
        }
    }
    s
}

fn render_host(s: &mut String, h: &Host) {
    s.push_str("host\n");
    line(s, "CPUs", h.cpus);
    line(
        s,
        "memory",
        format!(
            "{} total, {} available",
            opt(h.mem_total_bytes, binary),
            opt(h.mem_available_bytes, binary)
        ),
    );
    let who = match (h.root, h.cap_ipc_lock) {
        (true, true) => ", running as root",
        (false, true) => ", with CAP_IPC_LOCK",
        (true, false) => ", root without CAP_IPC_LOCK",
        (false, false) => "",
    };
    let limit = if h.memlock_unlimited {
        "unlimited".to_owned()
    } else {
        opt(h.memlock_bytes, binary)
    };
    line(s, "memory-lock limit", format!("{limit}{who}"));
    line(
        s,
        "transparent hugepages",
        h.transparent_hugepages.as_deref().unwrap_or("unknown"),
    );
    line(
        s,
        "freed memory",
        match h.free_page_reporting {
            Some(true) => {
                "taken back by the host (virtio-balloon free page reporting): memory allocated \
                 again after a pause is backed anew, slowly; pinfeed locks its pool once"
            }
            Some(false) => "kept (a balloon device without free page reporting)",
            None => "no virtio-balloon device seen (other hypervisors' balloons not checked)",
        },
    );
    line(s, "NUMA nodes", opt(h.numa_nodes, |n| n.to_string()));
}

fn render_gpu(s: &mut String, r: &Report) {
    s.push_str("gpu\n");
    if let Some(why) = &r.gpu_unavailable {
        s.push_str(&format!("  {why}\n"));
    }
    if let Some(g) = &r.gpu {
        line(
            s,
            "device",
            format!(
                "cuda:{} {} (compute capability {})",
                g.ordinal,
                g.name,
                g.compute_capability.as_deref().unwrap_or("unknown")
            ),
        );
        line(
            s,
            "driver",
            format!(
                "{} (CUDA {})",
                g.kernel_driver.as_deref().unwrap_or("unknown"),
                g.cuda_version.as_deref().unwrap_or("unknown")
            ),
        );
        line(
            s,
            "memory",
            format!(
                "{} total, {} free",
                opt(g.memory_total_bytes, binary),
                opt(g.memory_free_bytes, binary)
            ),
        );
        line(
            s,
            "PCI bus id",
            format!(
                "{}, {} copy engines",
                g.pci_bus_id.as_deref().unwrap_or("unknown"),
                opt(g.copy_engines, |n| n.to_string())
            ),
        );
        let link = if g.link.sysfs.is_some() {
            let load = g
                .link
                .under_load
                .as_ref()
                .map(|l| format!(", {} during copies", link_text(l)))
                .unwrap_or_default();
            format!(
                "{} at rest{load}, {} at most",
                link_text(&g.link.current),
                link_text(&g.link.max)
            )
        } else {
            "unknown (no sysfs entry for the device)".to_owned()
        };
        line(s, "PCIe link", link);
        let node = match (g.numa_node, &g.link.sysfs) {
            (Some(n), _) => n.to_string(),
            (None, Some(_)) => "none reported".to_owned(),
            (None, None) => "unknown".to_owned(),
        };
        let cpus = g
            .numa_cpus
            .as_deref()
            .map(|c| format!(" (local CPUs {c})"))
            .unwrap_or_default();
        line(s, "NUMA node", format!("{node}{cpus}"));
    }
}

fn render_measurements(s: &mut String, r: &Report) {
    s.push_str("measurements\n");
    if let Some(e) = &r.gpu_copies_error {
        line(s, "GPU measurements", format!("failed: {e}"));
    }
    if let Some(c) = &r.gpu_copies {
        let row = |rates: &[Rate]| {
            rates
                .iter()
                .map(|r| format!("{} {:.1} GB/s", binary(r.bytes as u64), r.gbps))
                .collect::<Vec<_>>()
                .join(", ")
        };
        line(s, "to GPU from pinned", row(&c.pinned));
        line(s, "to GPU from pageable", row(&c.pageable));
        let b = &c.batch;
        let batch = format!("one {} batch", mb(b.bytes));
        line(
            s,
            &batch,
            format!(
                "cuMemHostAlloc {} + cuMemFreeHost {}; cuMemHostRegister {} + unregister {}",
                ms(b.host_alloc_ms),
                ms(b.free_host_ms),
                ms(b.register_ms),
                ms(b.unregister_ms),
            ),
        );
        line(
            s,
            "",
            format!(
                "copy to GPU {} from pinned, {} from pageable",
                ms(b.pinned_copy_ms),
                ms(b.pageable_copy_ms)
            ),
        );
        line(
            s,
            "cuMemHostAlloc of 256 MiB",
            format!(
                "{} (copies timed with {})",
                ms(c.host_alloc_256mib_ms),
                if c.timing == "events" {
                    "CUDA events"
                } else {
                    "the wall clock"
                }
            ),
        );
    }
    let hc = &r.host_copies;
    line(
        s,
        "host memcpy",
        format!(
            "{:.1} GB/s on 1 thread, {:.1} GB/s on {} ({} copies)",
            hc.memcpy_1_thread_gbps,
            hc.memcpy_all_threads_gbps,
            hc.threads,
            binary(hc.bytes as u64)
        ),
    );
    if let Some(t) = &r.threads {
        line(s, "copy threads by default", &t.reason);
    }
    line(s, "image decode=\"auto\"", &r.image_decode);
    for m in &r.image_decode_measured {
        line(s, &format!("  {} on {}", m.dataset, m.device), &m.choice);
    }
    let batch = format!("mlock of one {} batch", mb(BATCH_BYTES));
    match (&hc.mlock_error, hc.batch_mlock_ms, hc.batch_munlock_ms) {
        (Some(e), _, _) => line(s, &batch, format!("refused: {e}")),
        (None, Some(l), Some(u)) => line(
            s,
            &batch,
            format!(
                "{} with a fresh mapping, munlock {}; memcpy of it {}",
                ms(l),
                ms(u),
                ms(hc.batch_memcpy_ms)
            ),
        ),
        _ => {}
    }
}

fn render_file(s: &mut String, f: &FileReport, path: Option<&Path>) {
    let name = path.map_or_else(|| f.path.clone(), |p| p.display().to_string());
    s.push_str(&format!("file {name}\n"));
    let cached = f
        .cached_fraction
        .map(|c| format!(", {:.0}% in the page cache", c * 100.0))
        .unwrap_or_default();
    line(s, "size", format!("{}{cached}", binary(f.size_bytes)));
    let rate = |r: &ReadRate| {
        format!(
            "{:.2} GB/s ({} in {})",
            r.gbps,
            binary(r.bytes),
            ms(r.seconds * 1e3)
        )
    };
    if let Some(b) = &f.buffered {
        let state = match b.cached_before {
            None => "cache state unknown".to_owned(),
            Some(c) if c >= 0.99 => "cached".to_owned(),
            Some(c) if c < 0.01 => "not cached".to_owned(),
            Some(c) => format!("{:.0}% cached", c * 100.0),
        };
        line(s, "buffered read", format!("{} ({state})", rate(b)));
    }
    if let Some(b) = &f.buffered_again {
        line(s, "buffered read again", format!("{} (cached)", rate(b)));
    } else if let Some(why) = &f.buffered_again_skipped {
        line(s, "buffered read again", format!("skipped: {why}"));
    }
    if let Some(d) = &f.direct {
        line(s, "O_DIRECT read", format!("{} (from disk)", rate(d)));
    } else if let Some(why) = &f.direct_refused {
        line(s, "O_DIRECT read", why);
    }
    if f.buffered.is_some_and(|b| b.bytes < MEANINGFUL_READ) {
        line(
            s,
            "",
            format!(
                "(under {} read: these rates are mostly timer noise)",
                binary(MEANINGFUL_READ)
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_read_well() {
        assert_eq!(binary(8 << 20), "8 MiB");
        assert_eq!(binary(256 << 20), "256 MiB");
        assert_eq!(binary(1536), "1.5 KiB");
        assert_eq!(binary(12), "12 B");
        assert_eq!(ms(1.764), "1.76 ms");
        assert_eq!(ms(92.04), "92.0 ms");
        assert_eq!(ms(411.2), "411 ms");
        assert_eq!(ms(0.0036), "3.6 µs");
        assert_eq!(mb(BATCH_BYTES), "2.95 MB");
    }
}
