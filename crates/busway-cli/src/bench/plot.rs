//! `busway bench --plot DIR`: each table as an SVG chart, one pair of bars per row (busway
//! beside its raw baseline of the same run). SVG is text (its labels are `<text>` the viewer
//! renders), so the chart is written here in a few lines rather than with a plotting crate
//! and its font machinery.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Width of a chart in pixels.
const WIDTH_PX: f64 = 960.0;
/// Width of the label column at the left, in pixels.
const LABEL_PX: f64 = 260.0;
/// Room at the right of the longest bar for its value, in pixels.
const VALUE_PX: f64 = 110.0;
/// Height of one bar, in pixels (a row has two).
const BAR_PX: f64 = 13.0;
/// Space between two rows, in pixels.
const ROW_GAP_PX: f64 = 10.0;
/// Height of the title and legend above the rows, in pixels.
const HEADER_PX: f64 = 62.0;
/// Colours of the busway bar and the raw bar.
const COLOURS: [&str; 2] = ["#1f6fb2", "#9a9a9a"];

/// One table as a chart: a label per row, and for each row busway's value and the raw one.
pub(super) struct Chart {
    /// The file's name without `.svg`.
    pub(super) name: &'static str,
    pub(super) title: String,
    /// What the values are (e.g. "M msg/s"); a longer bar is better unless `lower_is_better`.
    pub(super) unit: &'static str,
    pub(super) lower_is_better: bool,
    /// Names of the two series (busway's first).
    pub(super) series: [String; 2],
    /// (row label, busway value, raw value).
    pub(super) rows: Vec<(String, f64, f64)>,
}

/// Writes `chart` to `DIR/NAME.svg`; returns the path.
pub(super) fn write(dir: &Path, chart: &Chart) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("--plot {}: {e}", dir.display()))?;
    let path = dir.join(format!("{}.svg", chart.name));
    std::fs::write(&path, render(chart)).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// The chart as an SVG document.
fn render(chart: &Chart) -> String {
    let row_px = 2.0 * BAR_PX + ROW_GAP_PX;
    let height = HEADER_PX + row_px * chart.rows.len() as f64 + ROW_GAP_PX;
    let max = chart
        .rows
        .iter()
        .flat_map(|&(_, a, b)| [a, b])
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    // All zero (or missing): no bar has a length.
    let max = if max > 0.0 { max } else { 1.0 };
    let scale = (WIDTH_PX - LABEL_PX - VALUE_PX) / max;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH_PX}" height="{height}" viewBox="0 0 {WIDTH_PX} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="8" y="20" font-size="14" font-weight="bold">{}</text>"#,
        escape(&chart.title)
    );
    let better = if chart.lower_is_better {
        "shorter is better"
    } else {
        "longer is better"
    };
    let _ = write!(
        s,
        r#"<text x="8" y="40">{} ({better})</text>"#,
        escape(chart.unit)
    );
    for (i, name) in chart.series.iter().enumerate() {
        let x = LABEL_PX + 200.0 * i as f64;
        let _ = write!(
            s,
            r#"<rect x="{x}" y="30" width="12" height="12" fill="{}"/><text x="{}" y="40">{}</text>"#,
            COLOURS[i],
            x + 16.0,
            escape(name)
        );
    }
    s.push('\n');
    for (r, (label, bus, raw)) in chart.rows.iter().enumerate() {
        let top = HEADER_PX + row_px * r as f64;
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            LABEL_PX - 8.0,
            top + BAR_PX + 4.0,
            escape(label)
        );
        for (i, v) in [*bus, *raw].into_iter().enumerate() {
            let y = top + BAR_PX * i as f64;
            let w = if v.is_finite() { v * scale } else { 0.0 };
            let _ = write!(
                s,
                r#"<rect x="{LABEL_PX}" y="{y}" width="{w:.1}" height="{}" fill="{}"/><text x="{:.1}" y="{}" font-size="10">{}</text>"#,
                BAR_PX - 1.0,
                COLOURS[i],
                LABEL_PX + w + 4.0,
                y + BAR_PX - 3.0,
                figure(v)
            );
        }
        s.push('\n');
    }
    s.push_str("</svg>\n");
    s
}

/// A value with three significant figures.
fn figure(v: f64) -> String {
    match v.abs() {
        x if !x.is_finite() => "-".into(),
        x if x >= 100.0 => format!("{v:.0}"),
        x if x >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(rows: Vec<(String, f64, f64)>) -> Chart {
        Chart {
            name: "t",
            title: "a <title> & more".into(),
            unit: "M msg/s",
            lower_is_better: false,
            series: ["busway".into(), "raw".into()],
            rows,
        }
    }

    #[test]
    fn bars_are_scaled_to_the_largest_value_and_text_is_escaped() {
        let svg = render(&chart(vec![
            ("tcp4 8-128".into(), 10.0, 5.0),
            ("shm 8-128".into(), 2.0, 20.0),
        ]));
        let full = WIDTH_PX - LABEL_PX - VALUE_PX;
        assert!(svg.contains(&format!(r#"width="{:.1}""#, full)), "{svg}");
        assert!(
            svg.contains(&format!(r#"width="{:.1}""#, full / 2.0)),
            "{svg}"
        );
        assert!(
            svg.contains(&format!(r#"width="{:.1}""#, full / 10.0)),
            "{svg}"
        );
        assert!(svg.contains("a &lt;title&gt; &amp; more"));
        assert!(!svg.contains("<title>"));
        // Four bars and the legend's busway square.
        assert_eq!(svg.matches("<rect x=\"260\"").count(), 5);
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn a_missing_or_zero_value_draws_no_bar_and_no_nan() {
        let svg = render(&chart(vec![("x".into(), f64::NAN, 0.0)]));
        assert!(!svg.contains("NaN"), "{svg}");
        assert!(!svg.contains("inf"));
    }
}
