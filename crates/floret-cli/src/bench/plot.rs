//! A dependency-free SVG line chart for `--plot`: charts stacked
//! vertically, each with its series, a time axis in seconds and a linear or
//! logarithmic value axis.

use std::fmt::Write as _;
use std::path::Path;

const CHART_WIDTH: f64 = 900.0;
const CHART_HEIGHT: f64 = 300.0;
const MARGIN_LEFT: f64 = 70.0;
const MARGIN_RIGHT: f64 = 180.0;
const MARGIN_TOP: f64 = 30.0;
const MARGIN_BOTTOM: f64 = 40.0;
/// Ticks per axis.
const TICKS: usize = 5;

/// One line of a chart.
pub struct Series {
    pub name: String,
    pub colour: &'static str,
    /// (seconds, value) in time order.
    pub points: Vec<(f64, f64)>,
}

/// One chart: a title, the value axis and its lines.
pub struct Chart {
    pub title: String,
    pub value_label: String,
    pub logarithmic: bool,
    pub series: Vec<Series>,
}

/// Colours that stay apart on white, for flooders and the rest.
pub const FLOOD_COLOURS: [&str; 4] = ["#d62728", "#ff7f0e", "#8c564b", "#e377c2"];
pub const QUIET_COLOURS: [&str; 4] = ["#1f77b4", "#2ca02c", "#17becf", "#9467bd"];

/// Writes `charts` one under another into an SVG file at `path`.
pub fn write_svg(path: &Path, charts: &[Chart]) -> std::io::Result<()> {
    let total_height = CHART_HEIGHT * charts.len() as f64;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{CHART_WIDTH}" height="{total_height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (index, chart) in charts.iter().enumerate() {
        draw_chart(&mut svg, chart, CHART_HEIGHT * index as f64);
    }
    svg.push_str("</svg>\n");
    std::fs::write(path, svg)
}

fn draw_chart(svg: &mut String, chart: &Chart, top: f64) {
    let plot_left = MARGIN_LEFT;
    let plot_right = CHART_WIDTH - MARGIN_RIGHT;
    let plot_top = top + MARGIN_TOP;
    let plot_bottom = top + CHART_HEIGHT - MARGIN_BOTTOM;
    let points = chart.series.iter().flat_map(|series| series.points.iter());
    let (mut max_time, mut min_value, mut max_value) = (1.0f64, f64::INFINITY, 0.0f64);
    for &(time, value) in points {
        max_time = max_time.max(time);
        if !chart.logarithmic || value > 0.0 {
            min_value = min_value.min(value);
        }
        max_value = max_value.max(value);
    }
    let transform = |value: f64| -> f64 {
        if chart.logarithmic {
            value.max(f64::MIN_POSITIVE).log10()
        } else {
            value
        }
    };
    let (low, high) = if chart.logarithmic {
        let low = min_value.min(max_value).max(1e-3).log10().floor();
        let high = max_value.max(1e-3).log10().ceil().max(low + 1.0);
        (low, high)
    } else {
        (0.0, max_value.max(1.0) * 1.05)
    };
    let x = |time: f64| plot_left + (plot_right - plot_left) * time / max_time;
    let y = |value: f64| {
        let fraction = ((transform(value) - low) / (high - low)).clamp(0.0, 1.0);
        plot_bottom - (plot_bottom - plot_top) * fraction
    };
    let _ = writeln!(
        svg,
        r#"<text x="{plot_left}" y="{}" font-weight="bold">{}</text>"#,
        top + 18.0,
        escape(&chart.title)
    );
    let _ = writeln!(
        svg,
        r##"<rect x="{plot_left}" y="{plot_top}" width="{}" height="{}" fill="none" stroke="#888"/>"##,
        plot_right - plot_left,
        plot_bottom - plot_top
    );
    for tick in 0..=TICKS {
        let fraction = tick as f64 / TICKS as f64;
        let time = max_time * fraction;
        let decimals = if max_time < 10.0 { 1 } else { 0 };
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{time:.decimals$}</text>"#,
            x(time),
            plot_bottom + 15.0
        );
        let raw = low + (high - low) * fraction;
        let value = if chart.logarithmic {
            10f64.powf(raw)
        } else {
            raw
        };
        let label_y = plot_bottom - (plot_bottom - plot_top) * fraction;
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><line x1="{plot_left}" x2="{plot_right}" y1="{label_y:.1}" y2="{label_y:.1}" stroke="#eee"/>"##,
            plot_left - 5.0,
            label_y + 4.0,
            short_number(value)
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">seconds since start</text>"#,
        (plot_left + plot_right) / 2.0,
        plot_bottom + 32.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(14,{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        (plot_top + plot_bottom) / 2.0,
        escape(&chart.value_label)
    );
    let drawn = chart.series.iter().filter(|series| {
        series
            .points
            .iter()
            .any(|(_, value)| !chart.logarithmic || *value > 0.0)
    });
    for (index, series) in drawn.enumerate() {
        let path: Vec<String> = series
            .points
            .iter()
            .filter(|(_, value)| !chart.logarithmic || *value > 0.0)
            .map(|&(time, value)| format!("{:.1},{:.1}", x(time), y(value)))
            .collect();
        if !path.is_empty() {
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"/>"#,
                series.colour,
                path.join(" ")
            );
        }
        let legend_y = plot_top + 14.0 * index as f64 + 8.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{:.1}" x2="{:.1}" y1="{legend_y:.1}" y2="{legend_y:.1}" stroke="{}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            plot_right + 10.0,
            plot_right + 30.0,
            series.colour,
            plot_right + 35.0,
            legend_y + 4.0,
            escape(&series.name)
        );
    }
}

fn short_number(value: f64) -> String {
    match value.abs() {
        v if v >= 1e6 => format!("{:.1}M", value / 1e6),
        v if v >= 1e3 => format!("{:.1}k", value / 1e3),
        v if v >= 1.0 || v == 0.0 => format!("{value:.0}"),
        _ => format!("{value:.3}"),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_names_every_series_and_draws_its_points() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plot.svg");
        let chart = Chart {
            title: "deliveries <per second>".into(),
            value_label: "msg/s".into(),
            logarithmic: true,
            series: vec![
                Series {
                    name: "flooder".into(),
                    colour: FLOOD_COLOURS[0],
                    points: vec![(0.0, 10.0), (1.0, 1000.0)],
                },
                Series {
                    name: "quiet".into(),
                    colour: QUIET_COLOURS[0],
                    points: vec![(0.0, 0.0), (1.0, 20.0)],
                },
            ],
        };
        write_svg(&path, &[chart]).unwrap();
        let svg = std::fs::read_to_string(path).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("deliveries &lt;per second&gt;"));
        assert!(svg.contains(">flooder<") && svg.contains(">quiet<"));
        assert_eq!(svg.matches("<polyline").count(), 2);
    }
}
