//! Where the time went: counters kept by every stage, and the bottleneck they point to.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::DeviceSpec;

/// Counters the pipeline's threads add to as they work (nanoseconds and bytes).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) read_ns: AtomicU64,
    pub(crate) read_bytes: AtomicU64,
    pub(crate) transform_ns: AtomicU64,
    pub(crate) copy_issue_ns: AtomicU64,
    /// The copy thread waiting for the consumer to take a batch (the queue was full).
    pub(crate) wait_consumer_ns: AtomicU64,
    /// The consumer waiting in `next()` for a batch.
    pub(crate) consumer_wait_ns: AtomicU64,
}

/// What the consumer has received on one device.
#[derive(Debug, Default)]
pub(crate) struct Delivered {
    pub(crate) batches: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) records: AtomicU64,
}

pub(crate) fn add(counter: &AtomicU64, elapsed: Duration) {
    counter.fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
}

pub(crate) fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// What limits the loader, judged from where its threads waited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bottleneck {
    /// The consumer takes batches more slowly than they arrive.
    Consumer,
    /// Readers (disk, page cache or transform) cannot keep the slots filled.
    Read,
    /// Filled slots wait for the copy engine (PCIe, or the host copy thread).
    Copy,
    /// Readers cannot keep the slots filled because they wait on object storage: the
    /// network (or the store behind it) is the limit.
    Network,
    /// Too little has happened yet to tell.
    Unknown,
}

impl fmt::Display for Bottleneck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Bottleneck::Consumer => "consumer-bound",
            Bottleneck::Read => "read-bound",
            Bottleneck::Copy => "copy-bound",
            Bottleneck::Network => "network-bound",
            Bottleneck::Unknown => "unknown",
        })
    }
}

/// Where the stages of a pipeline waited: a producer (the loader's readers, or the iterable of
/// a Python `prefetch`), a copy stage (the loader's copy thread, or `prefetch`'s upload thread)
/// and the consumer. What [`StageTimes::bottleneck`], the one rule for both, judges from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageTimes {
    /// Wall time the pipeline has run.
    pub elapsed: Duration,
    /// Items (batches) handed to the consumer.
    pub items: u64,
    /// Time the consumer waited for an item.
    pub consumer_wait: Duration,
    /// Time the copy stage waited for the producer's next item.
    pub copy_starved: Duration,
    /// Time the copy stage waited for the consumer to take an item (its queue was full);
    /// `None` where that wait is not told apart from `copy_starved`.
    pub copy_blocked: Option<Duration>,
    /// For a producer that reads object storage: the time it spent producing (summed over its
    /// threads) and, of that, the time it waited on the network. `None` otherwise.
    pub network: Option<(Duration, Duration)>,
}

impl StageTimes {
    /// Which stage limits the pipeline, judged from where the stages waited.
    ///
    /// A consumer that rarely waits (under 10% of the time), while the copy stage waits for it
    /// (over 10%, when that is known), is the bottleneck itself. Otherwise a copy stage that
    /// waits for the producer over a quarter of the time means the producer is behind
    /// ([`Bottleneck::Read`]), and when more than half of the producer's time went waiting on
    /// object storage, the network is ([`Bottleneck::Network`]); else the copy stage is
    /// ([`Bottleneck::Copy`]). Fewer than two items tell nothing ([`Bottleneck::Unknown`]).
    pub fn bottleneck(&self) -> Bottleneck {
        let wall = self.elapsed.as_secs_f64();
        if self.items < 2 || wall <= 0.0 {
            return Bottleneck::Unknown;
        }
        let share = |d: Duration| d.as_secs_f64() / wall;
        let copier_blocked = self.copy_blocked.is_none_or(|d| share(d) > 0.1);
        if share(self.consumer_wait) < 0.1 && copier_blocked {
            Bottleneck::Consumer
        } else if share(self.copy_starved) > 0.25 {
            match self.network {
                Some((busy, waited)) if waited.as_secs_f64() > 0.5 * busy.as_secs_f64() => {
                    Bottleneck::Network
                }
                _ => Bottleneck::Read,
            }
        } else {
            Bottleneck::Copy
        }
    }

    /// One line that starts with the stage [`bottleneck`](StageTimes::bottleneck) names
    /// (`the consumer`, `producer` or `copier`) and gives the waits behind the verdict;
    /// `nothing delivered yet` before the first item.
    pub fn explain(&self, producer: &str, copier: &str) -> String {
        let (wall, waited) = (self.elapsed.as_secs_f64(), self.consumer_wait.as_secs_f64());
        let starved = self.copy_starved.as_secs_f64();
        match self.bottleneck() {
            Bottleneck::Unknown if self.items == 0 => "nothing delivered yet".to_string(),
            Bottleneck::Unknown => format!(
                "too few items ({}) to tell what limits the pipeline",
                self.items
            ),
            Bottleneck::Consumer => format!(
                "the consumer: it waited {waited:.3} s of {wall:.3} s for data, so the loop body, \
                 not the data, sets the pace"
            ),
            Bottleneck::Read => format!(
                "{producer}: {copier} waited {starved:.3} s of {wall:.3} s for it (the consumer \
                 waited {waited:.3} s)"
            ),
            Bottleneck::Network => {
                let (busy, net) = self.network.unwrap_or_default();
                format!(
                    "the network: {producer} spent {:.3} s of its {:.3} s waiting on object \
                     storage, and {copier} waited {starved:.3} s of {wall:.3} s for it (the \
                     consumer waited {waited:.3} s)",
                    net.as_secs_f64(),
                    busy.as_secs_f64()
                )
            }
            Bottleneck::Copy => format!(
                "{copier}: it waited only {starved:.3} s of {wall:.3} s for {producer}, and the \
                 consumer waited {waited:.3} s"
            ),
        }
    }
}

/// What one device received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceStats {
    /// The device.
    pub device: DeviceSpec,
    /// Batches handed to the consumer for this device.
    pub batches: u64,
    /// Records in them.
    pub records: u64,
    /// Bytes in them.
    pub bytes: u64,
    /// The most device bytes held at once by this device's batches.
    pub device_bytes_peak: usize,
}

/// A snapshot of a loader's counters. Times summed over threads can exceed the wall time.
///
/// A loader replicating to several devices (`MultiLoader::replicated`) reads each batch once
/// and copies it to every device: `read_bytes` counts the dataset once, `bytes` once per device.
#[derive(Clone, Debug)]
pub struct Stats {
    /// Where batches go (the first device, when there are several: see `devices`).
    pub device: DeviceSpec,
    /// What each device received, in the order the devices were given (one entry for a
    /// loader of one device).
    pub devices: Vec<DeviceStats>,
    /// Wall time since the loader started (after start-up).
    pub elapsed: Duration,
    /// Time start-up took: checking the source, drawing the order (unless drawn ahead),
    /// page-locking the pool, starting threads. Not part of `elapsed`.
    pub startup: Duration,
    /// Batches handed to the consumer, over all devices.
    pub batches: u64,
    /// Records handed to the consumer, over all devices.
    pub records: u64,
    /// Bytes handed to the consumer, over all devices.
    pub bytes: u64,
    /// Reader threads (the one registrar thread for the register reader).
    pub threads: usize,
    /// Why that many, in words (`pinfeed::tune`).
    pub threads_reason: String,
    /// The machine's measured copy and bus rates the thread count was chosen from, if it was.
    pub machine: Option<crate::tune::MachineRates>,
    /// How records reached the device.
    pub reader: crate::Reader,
    /// How the source reads, in words: `pread`, `O_DIRECT`, `io_uring (depth 32)`, a fallback
    /// with its reason, or the register reader's mapping.
    pub reader_description: String,
    /// Time readers spent reading, summed over threads.
    pub read_time: Duration,
    /// Bytes read from the source.
    pub read_bytes: u64,
    /// Time readers spent in the transform, summed over threads.
    pub transform_time: Duration,
    /// Time readers waited for a free slot, summed over threads.
    pub wait_free_slot: Duration,
    /// Of `wait_free_slot`, the time no copy was in flight (none issued and not yet taken
    /// back): every slot was being read into, or filled and held back (past the copy thread's
    /// window behind a batch still being read, or for a consumer that was behind).
    pub wait_free_slot_no_copy: Duration,
    /// Time the copy thread waited for the next batch to be filled.
    pub wait_filled: Duration,
    /// Of `wait_filled`, the time a later piece or batch was filled already, past the window
    /// the copy thread copies in fill order (from the oldest batch not yet delivered, a piece
    /// for each reader, at least that batch's; one batch with a device budget or GPU
    /// decoding): one still being read held back those read after it.
    pub wait_filled_behind: Duration,
    /// Time the copy thread spent issuing copies.
    pub copy_issue_time: Duration,
    /// Time the copy thread waited for the consumer to take a batch.
    pub wait_consumer: Duration,
    /// Time the consumer waited for a batch.
    pub consumer_wait: Duration,
    /// Slots in the ring.
    pub slots: usize,
    /// Bytes in one slot.
    pub slot_bytes: usize,
    /// Bytes of page-locked memory the slots use: all of it taken at start-up (from a finished
    /// loader's idle pool when one serves, which may be larger: see the pool's reuse rule).
    pub pinned_bytes: usize,
    /// The most page-locked bytes held at any time (the pool is the only page-locked memory a
    /// loader holds, so this equals `pinned_bytes`).
    pub pinned_bytes_peak: usize,
    /// Whether the pool is really page-locked (the host backend falls back to ordinary memory
    /// when the memory-lock limit is too low).
    pub pinned_locked: bool,
    /// Which NUMA node the pool's pages were put on, and why: `node 1 (the GPU's)`,
    /// `no NUMA (one node)`, or `not placed: <reason>` (`cuMemHostAlloc`, the host backend, a
    /// failed `mbind`, an unknown GPU node).
    pub pinned_numa: String,
    /// Page-locked allocations made by this process since the loader finished starting: zero.
    pub pinned_allocations_after_start: u64,
    /// Slots reused after their copy completed.
    pub slots_recycled: u64,
    /// Times a reader found no free slot.
    pub slot_waits: u64,
    /// Slots claimed by the readers (one a batch, or a piece of one).
    pub slot_claims: u64,
    /// Claims in which a reader got back a slot it had filled itself (the ring prefers those:
    /// docs/ARCHITECTURE.md, "The slot life cycle").
    pub slot_claims_own: u64,
    /// The most slots out of the free list at once.
    pub slots_peak_in_use: usize,
    /// The most device bytes held by batches at once on one device (the largest of
    /// `devices`' peaks).
    pub device_bytes_peak: usize,
    /// What the source fetched from object storage (`None` for local files and memory).
    pub network: Option<pinfeed_source::NetworkStats>,
}

impl Stats {
    /// The counters of several loaders running side by side (one per device, each on its
    /// shard: `MultiLoader::new`) as one: counts, bytes, times and pinned memory summed, the
    /// longest wall time and start-up, every device's entry; `None` for no loader. The
    /// bottleneck of the whole is judged from the summed waits, so it says which stage waited
    /// most, not which loader.
    pub fn combine(parts: &[Stats]) -> Option<Stats> {
        let (first, rest) = parts.split_first()?;
        let mut all = first.clone();
        for s in rest {
            all.devices.extend(s.devices.iter().cloned());
            all.elapsed = all.elapsed.max(s.elapsed);
            all.startup = all.startup.max(s.startup);
            all.batches += s.batches;
            all.records += s.records;
            all.bytes += s.bytes;
            all.threads += s.threads;
            all.read_time += s.read_time;
            all.read_bytes += s.read_bytes;
            all.transform_time += s.transform_time;
            all.wait_free_slot += s.wait_free_slot;
            all.wait_free_slot_no_copy += s.wait_free_slot_no_copy;
            all.wait_filled += s.wait_filled;
            all.wait_filled_behind += s.wait_filled_behind;
            all.copy_issue_time += s.copy_issue_time;
            all.wait_consumer += s.wait_consumer;
            all.consumer_wait += s.consumer_wait;
            all.slots += s.slots;
            all.slot_bytes = all.slot_bytes.max(s.slot_bytes);
            all.pinned_bytes += s.pinned_bytes;
            all.pinned_bytes_peak += s.pinned_bytes_peak;
            all.pinned_locked &= s.pinned_locked;
            all.pinned_allocations_after_start = all
                .pinned_allocations_after_start
                .max(s.pinned_allocations_after_start);
            all.slots_recycled += s.slots_recycled;
            all.slot_waits += s.slot_waits;
            all.slot_claims += s.slot_claims;
            all.slot_claims_own += s.slot_claims_own;
            all.slots_peak_in_use += s.slots_peak_in_use;
            all.device_bytes_peak = all.device_bytes_peak.max(s.device_bytes_peak);
            all.network = match (all.network.take(), &s.network) {
                (Some(mut a), Some(b)) => {
                    a.add(b);
                    Some(a)
                }
                (a, b) => a.or_else(|| b.clone()),
            };
        }
        Some(all)
    }

    /// Bytes per second delivered over all devices, in GB/s (10^9).
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }

    /// The waits the bottleneck is judged from (see [`StageTimes`]).
    pub fn stage_times(&self) -> StageTimes {
        StageTimes {
            elapsed: self.elapsed,
            items: self.batches,
            consumer_wait: self.consumer_wait,
            copy_starved: self.wait_filled,
            copy_blocked: Some(self.wait_consumer),
            network: self
                .network
                .as_ref()
                .map(|n| (self.read_time, n.wait.min(self.read_time))),
        }
    }

    /// Which stage limits the loader: [`StageTimes::bottleneck`] of its waits.
    pub fn bottleneck(&self) -> Bottleneck {
        self.stage_times().bottleneck()
    }

    /// One sentence on what limits the loader and by how much.
    pub fn explain(&self) -> String {
        let read_rate = self.read_bytes as f64 / self.read_time.as_secs_f64().max(1e-9) / 1e9;
        let share = |t: Duration| 100.0 * t.as_secs_f64() / self.elapsed.as_secs_f64().max(1e-9);
        // The part of the copy thread's wait in which later batches, past its window, were
        // filled already, behind one still being read, named where it is 1% or more of that
        // wait.
        let behind = 100.0 * self.wait_filled_behind.as_secs_f64()
            / self.wait_filled.as_secs_f64().max(1e-9);
        let behind = if behind >= 1.0 {
            format!(
                ", {behind:.0}% of it behind a batch still being read while later ones were filled"
            )
        } else {
            String::new()
        };
        match self.bottleneck() {
            Bottleneck::Consumer => format!(
                "consumer-bound: the consumer waited {:.0}% of the time for data; batches were ready ahead",
                share(self.consumer_wait)
            ),
            Bottleneck::Read => format!(
                "read-bound: {} reader thread(s) read at {:.2} GB/s each; the copy engine waited {:.0}% of the time{behind}",
                self.threads,
                read_rate,
                share(self.wait_filled)
            ),
            Bottleneck::Copy => format!(
                "copy-bound: {:.2} GB/s delivered while readers waited {:.2} s for free slots \
                 ({:.2} s of it with no copy in flight)",
                self.gbps(),
                self.wait_free_slot.as_secs_f64(),
                self.wait_free_slot_no_copy.as_secs_f64()
            ),
            Bottleneck::Network => {
                let net = self.network.clone().unwrap_or_default();
                format!(
                    "network-bound: {} reader thread(s) waited {:.2} s of their {:.2} s reading \
                     on object storage ({:.2} GB/s fetched in {} requests, {} retried); the copy \
                     engine waited {:.0}% of the time{behind}",
                    self.threads,
                    // Timed around each request, so it may pass the read time by a hair.
                    net.wait.min(self.read_time).as_secs_f64(),
                    self.read_time.as_secs_f64(),
                    net.bytes_fetched as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e9,
                    net.requests,
                    net.retries,
                    share(self.wait_filled)
                )
            }
            Bottleneck::Unknown => "too few batches to tell what limits the loader".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(consumer_wait: f64, copy_starved: f64, copy_blocked: Option<f64>) -> StageTimes {
        StageTimes {
            elapsed: Duration::from_secs(10),
            items: 100,
            consumer_wait: Duration::from_secs_f64(consumer_wait),
            copy_starved: Duration::from_secs_f64(copy_starved),
            copy_blocked: copy_blocked.map(Duration::from_secs_f64),
            network: None,
        }
    }

    #[test]
    fn the_stage_everyone_waits_for_is_the_bottleneck() {
        // A consumer that never waits, while the copy thread waits for it.
        assert_eq!(
            times(0.5, 0.0, Some(8.0)).bottleneck(),
            Bottleneck::Consumer
        );
        // ... unless the copy thread does not wait for it either: then look upstream.
        assert_eq!(times(0.5, 5.0, Some(0.5)).bottleneck(), Bottleneck::Read);
        // A copy wait that is not told apart counts as waiting for the consumer.
        assert_eq!(times(0.5, 5.0, None).bottleneck(), Bottleneck::Consumer);
        assert_eq!(times(6.0, 5.0, Some(0.0)).bottleneck(), Bottleneck::Read);
        assert_eq!(times(6.0, 1.0, Some(0.0)).bottleneck(), Bottleneck::Copy);
        let one = StageTimes {
            items: 1,
            ..times(6.0, 5.0, None)
        };
        assert_eq!(one.bottleneck(), Bottleneck::Unknown);
    }

    #[test]
    fn readers_waiting_on_the_network_name_the_network() {
        let secs = Duration::from_secs_f64;
        let starved = times(6.0, 5.0, Some(0.0));
        let mostly_network = StageTimes {
            network: Some((secs(8.0), secs(6.0))),
            ..starved
        };
        assert_eq!(mostly_network.bottleneck(), Bottleneck::Network);
        assert!(mostly_network
            .explain("the readers", "the copy thread")
            .starts_with("the network: the readers spent 6.000 s of its 8.000 s"));
        let mostly_parsing = StageTimes {
            network: Some((secs(8.0), secs(2.0))),
            ..starved
        };
        assert_eq!(mostly_parsing.bottleneck(), Bottleneck::Read);
        // A copy-bound pipeline stays copy-bound, however slow its network.
        let copy_bound = StageTimes {
            network: Some((secs(8.0), secs(8.0))),
            ..times(6.0, 1.0, Some(0.0))
        };
        assert_eq!(copy_bound.bottleneck(), Bottleneck::Copy);
    }

    #[test]
    fn explanations_start_with_the_stage_named() {
        let name = |t: StageTimes| t.explain("the iterable", "the upload");
        assert!(name(times(0.5, 0.0, None)).starts_with("the consumer: "));
        assert!(name(times(6.0, 5.0, None)).starts_with("the iterable: the upload waited 5.000 s"));
        assert!(name(times(6.0, 1.0, None)).starts_with("the upload: "));
        let none = StageTimes {
            items: 0,
            ..times(6.0, 1.0, None)
        };
        assert_eq!(name(none), "nothing delivered yet");
    }
}
