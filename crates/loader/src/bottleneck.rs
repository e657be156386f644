//! The one rule that names what limits a pipeline of three stages: a producer (the loader's
//! readers, or the iterable `prefetch` runs), a copy stage (the copy engine, or `prefetch`'s
//! upload thread) and the consumer. Both the loader's [`Stats`](crate::Stats) and the Python
//! `prefetch` report judge with it, from where the copy stage and the consumer waited.

use std::time::Duration;

use crate::Bottleneck;

/// Where a three-stage pipeline waited, summed over its run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageWaits {
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Items (batches) handed to the consumer.
    pub delivered: u64,
    /// The consumer waiting for an item.
    pub consumer_wait: Duration,
    /// The copy stage waiting for the producer (nothing filled to copy).
    pub copy_starved: Duration,
    /// The copy stage waiting for the consumer (no room for what it copied).
    pub copy_blocked: Duration,
}

/// What limits the pipeline: the consumer when it hardly waited while the copy stage waited
/// for it; the producer when the copy stage starved a quarter of the time; else the copy.
/// Fewer than two items, or no time, tell nothing.
pub fn bottleneck(w: &StageWaits) -> Bottleneck {
    let wall = w.elapsed.as_secs_f64();
    if w.delivered < 2 || wall <= 0.0 {
        return Bottleneck::Unknown;
    }
    let consumer_waited = w.consumer_wait.as_secs_f64() / wall;
    let copy_starved = w.copy_starved.as_secs_f64() / wall;
    let copy_blocked = w.copy_blocked.as_secs_f64() / wall;
    if consumer_waited < 0.1 && copy_blocked > 0.1 {
        Bottleneck::Consumer
    } else if copy_starved > 0.25 {
        Bottleneck::Read
    } else {
        Bottleneck::Copy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waits(consumer: f64, starved: f64, blocked: f64) -> StageWaits {
        StageWaits {
            elapsed: Duration::from_secs(10),
            delivered: 100,
            consumer_wait: Duration::from_secs_f64(consumer),
            copy_starved: Duration::from_secs_f64(starved),
            copy_blocked: Duration::from_secs_f64(blocked),
        }
    }

    #[test]
    fn a_consumer_that_hardly_waits_while_the_copy_waits_for_it_is_the_limit() {
        assert_eq!(bottleneck(&waits(0.5, 0.0, 5.0)), Bottleneck::Consumer);
    }

    #[test]
    fn a_starved_copy_stage_points_at_the_producer() {
        assert_eq!(bottleneck(&waits(6.0, 3.0, 0.0)), Bottleneck::Read);
    }

    #[test]
    fn otherwise_the_copy_is_the_limit() {
        assert_eq!(bottleneck(&waits(6.0, 1.0, 0.0)), Bottleneck::Copy);
        // A consumer that waits a lot is not the limit even if the copy was once blocked.
        assert_eq!(bottleneck(&waits(6.0, 1.0, 5.0)), Bottleneck::Copy);
    }

    #[test]
    fn too_little_tells_nothing() {
        let mut w = waits(0.0, 0.0, 5.0);
        w.delivered = 1;
        assert_eq!(bottleneck(&w), Bottleneck::Unknown);
        let none = StageWaits::default();
        assert_eq!(bottleneck(&none), Bottleneck::Unknown);
    }
}
