//! `pinfeed stream --plot out.png`: throughput and where each stage waited, over time.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use pinfeed::Stats;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

/// DejaVu Sans (its licence is beside it in `assets/`): plotters draws text with a font it is
/// given, and a font of our own keeps the plot independent of the fonts a machine has.
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// One interval between samples: its end (seconds), the delivered and read rates (GB/s), and
/// the share of it that readers (per thread), the copy thread and the consumer spent waiting.
struct Interval {
    end: f64,
    delivered: f64,
    read: f64,
    readers_waiting: f64,
    copy_waiting: f64,
    consumer_waiting: f64,
}

/// Samples of a loader's counters taken while it runs.
#[derive(Default)]
pub struct Timeline {
    samples: Vec<(f64, Stats)>,
    last: Option<Instant>,
}

impl Timeline {
    /// Keeps a snapshot when at least `every` seconds passed since the last one.
    pub fn sample(&mut self, started: Instant, every: f64, stats: impl FnOnce() -> Stats) {
        let now = Instant::now();
        if self.last.is_some_and(|t| (now - t).as_secs_f64() < every) {
            return;
        }
        self.last = Some(now);
        self.samples.push(((now - started).as_secs_f64(), stats()));
    }

    /// Adds the final snapshot.
    pub fn finish(&mut self, started: Instant, stats: Stats) {
        self.samples.push((started.elapsed().as_secs_f64(), stats));
    }

    /// Rates and waits per interval between samples.
    fn series(&self) -> Vec<Interval> {
        self.samples
            .windows(2)
            .filter_map(|w| {
                let ((t0, a), (t1, b)) = (&w[0], &w[1]);
                let dt = t1 - t0;
                (dt > 0.0).then(|| {
                    let secs = |x: std::time::Duration, y: std::time::Duration| {
                        x.saturating_sub(y).as_secs_f64()
                    };
                    Interval {
                        end: *t1,
                        delivered: (b.bytes - a.bytes) as f64 / dt / 1e9,
                        read: (b.read_bytes - a.read_bytes) as f64 / dt / 1e9,
                        readers_waiting: secs(b.wait_free_slot, a.wait_free_slot)
                            / dt
                            / b.threads.max(1) as f64,
                        copy_waiting: secs(b.wait_filled, a.wait_filled) / dt,
                        consumer_waiting: secs(b.consumer_wait, a.consumer_wait) / dt,
                    }
                })
            })
            .collect()
    }

    /// Draws the timeline as a PNG.
    pub fn draw(&self, path: &Path, title: &str) -> Result<()> {
        // Registering twice is harmless; a bad font would be a bug in the build.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
        let series = self.series();
        let t_end = series.last().map_or(1.0, |s| s.end).max(1e-3);
        let rate_max = series
            .iter()
            .map(|s| s.delivered.max(s.read))
            .fold(0.0f64, f64::max)
            .max(0.1)
            * 1.15;
        let root = BitMapBackend::new(path, (1000, 700)).into_drawing_area();
        let draw = || -> Result<(), Box<dyn std::error::Error>> {
            root.fill(&WHITE)?;
            let (top, bottom) = root.split_vertically(380);
            let mut rates = ChartBuilder::on(&top)
                .caption(title, ("sans-serif", 20))
                .margin(10)
                .x_label_area_size(35)
                .y_label_area_size(55)
                .build_cartesian_2d(0.0..t_end, 0.0..rate_max)?;
            rates
                .configure_mesh()
                .x_desc("seconds")
                .y_desc("GB/s")
                .draw()?;
            draw_lines(
                &mut rates,
                &series,
                &[
                    ("delivered to the device", BLUE, |s| s.delivered),
                    ("read from the source", GREEN, |s| s.read),
                ],
            )?;
            let mut waits = ChartBuilder::on(&bottom)
                .caption("share of each interval spent waiting", ("sans-serif", 16))
                .margin(10)
                .x_label_area_size(35)
                .y_label_area_size(55)
                .build_cartesian_2d(0.0..t_end, 0.0..105.0)?;
            waits
                .configure_mesh()
                .x_desc("seconds")
                .y_desc("% of time")
                .draw()?;
            draw_lines(
                &mut waits,
                &series,
                &[
                    (
                        "readers, for a free slot (copy or consumer behind)",
                        RED,
                        |s| percent(s.readers_waiting),
                    ),
                    (
                        "copy engine, for a filled slot (readers behind)",
                        MAGENTA,
                        |s| percent(s.copy_waiting),
                    ),
                    ("consumer, for a batch", CYAN, |s| {
                        percent(s.consumer_waiting)
                    }),
                ],
            )?;
            root.present()?;
            Ok(())
        };
        draw()
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("{}: cannot draw the plot", path.display()))
    }
}

/// One line of a chart: its legend, its colour and its value in an interval.
type Line = (&'static str, RGBColor, fn(&Interval) -> f64);

/// Draws `lines` over the intervals of `series` on `chart`, then the legend.
fn draw_lines<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    series: &[Interval],
    lines: &[Line],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    for &(label, color, value) in lines {
        chart
            .draw_series(LineSeries::new(
                series.iter().map(|s| (s.end, value(s))),
                color.stroke_width(2),
            ))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
}

/// A share of an interval as a percentage, clipped to the chart's 100.
fn percent(share: f64) -> f64 {
    (share * 100.0).min(100.0)
}
