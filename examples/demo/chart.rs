//! The demo's chart: backend loads (log scale) and p99 latency against the concurrency (log
//! scale), one line per scenario, side by side in one SVG file.

use std::fmt::Display;
use std::path::Path;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::stampede::{Report, Scenario};

/// Width and height of the chart, in pixels.
const SIZE: (u32, u32) = (1000, 460);

/// Length of a dash, and of the gap after it, in pixels.
const DASH: u32 = 8;
const GAP: u32 = 5;

/// A scenario's colour, and whether its line is dashed (so that it shows where it lies on
/// another one).
fn look(scenario: Scenario) -> (RGBColor, bool) {
    match scenario {
        Scenario::NoCache => (RGBColor(214, 39, 40), false),
        Scenario::L1Only => (RGBColor(255, 127, 14), false),
        Scenario::Guarded {
            notifications: true,
        } => (RGBColor(44, 160, 44), false),
        Scenario::Guarded {
            notifications: false,
        } => (RGBColor(31, 119, 180), true),
    }
}

/// Writes the chart of `reports` (each scenario of `scenarios` at each concurrency) to `path`.
pub fn draw(
    path: &Path,
    caption: &str,
    scenarios: &[Scenario],
    reports: &[Report],
) -> Result<(), String> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(text)?;
    let root = root.titled(caption, ("sans-serif", 20)).map_err(text)?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2);

    let loads = |r: &Report| Some(r.loads as f64);
    let p99 = |r: &Report| r.latency_ms(99);
    panel(
        &left,
        "backend loads (log scale)",
        (0.7..top(reports, &loads) * 1.5).log_scale(),
        scenarios,
        reports,
        &loads,
        true,
    )?;
    panel(
        &right,
        "p99 latency, ms",
        0.0..top(reports, &p99) * 1.15,
        scenarios,
        reports,
        &p99,
        false,
    )?;
    root.present().map_err(text)
}

/// The highest `figure` of `reports`, at least 1.
fn top(reports: &[Report], figure: &dyn Fn(&Report) -> Option<f64>) -> f64 {
    reports.iter().filter_map(figure).fold(1.0, f64::max)
}

/// One panel: `figure` of every report (on the `y` axis) against its concurrency (log
/// scale), a line per scenario, and the scenarios' legend if `legend`.
fn panel<Y>(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    y: Y,
    scenarios: &[Scenario],
    reports: &[Report],
    figure: &dyn Fn(&Report) -> Option<f64>,
    legend: bool,
) -> Result<(), String>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let concurrency = (0.7..top(reports, &|r| Some(r.requests as f64)) * 1.5).log_scale();
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(concurrency, y)
        .map_err(text)?;
    chart
        .configure_mesh()
        .x_desc("concurrent requests for one key (log scale)")
        .x_label_formatter(&|v| format!("{v}"))
        .y_label_formatter(&|v| format!("{v}"))
        .light_line_style(WHITE)
        .draw()
        .map_err(text)?;
    for &scenario in scenarios {
        let points: Vec<(f64, f64)> = (reports.iter())
            .filter(|r| r.scenario == scenario)
            .filter_map(|r| Some((r.requests as f64, figure(r)?)))
            .collect();
        let (colour, dashed) = look(scenario);
        let line = colour.stroke_width(2);
        if dashed {
            chart
                .draw_series(DashedLineSeries::new(points.clone(), DASH, GAP, line))
                .map_err(text)?
                .label(scenario.name())
                .legend(move |(x, y)| {
                    DashedPathElement::new([(x, y), (x + 24, y)], DASH, GAP, line)
                });
        } else {
            chart
                .draw_series(LineSeries::new(points.clone(), line))
                .map_err(text)?
                .label(scenario.name())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], line));
        }
        let marker = if dashed { line } else { colour.filled() };
        chart
            .draw_series(points.into_iter().map(|p| Circle::new(p, 4, marker)))
            .map_err(text)?;
    }
    if !legend {
        return Ok(());
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(text)
}

/// A plotters error as text.
fn text(error: impl Display) -> String {
    error.to_string()
}
