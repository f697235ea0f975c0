//! `busway bench --plot DIR`: each table as an SVG chart, one pair of bars per row (busway
//! beside its raw baseline of the same run). SVG is text (its labels are `<text>` the viewer
//! renders), so the chart is written here in a few lines rather than with a plotting crate
//! and its font machinery.
//!
//! Top to bottom, each in a band of its own so none is drawn over another whatever the length
//! of its text: the title, the legend, the rows, the axis with its tick labels, the axis
//! caption (the unit). The axis is linear from 0, or logarithmic with a tick per decade when
//! the chart's values span more than `LINEAR_SPAN_MAX` (a latency chart of rings and sockets,
//! a calls/s chart from 1 to 10,000 in flight), where a linear one shows its small rows as
//! slivers.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Width of a chart in pixels.
const WIDTH_PX: f64 = 960.0;
/// Width of the label column at the left, in pixels.
const LABEL_PX: f64 = 260.0;
/// Room at the right of the longest bar for its value, in pixels.
const VALUE_PX: f64 = 110.0;
/// Width of the plot, from the label column to where the longest bar ends, in pixels.
const PLOT_PX: f64 = WIDTH_PX - LABEL_PX - VALUE_PX;
/// Height of one bar, in pixels (a row has two).
const BAR_PX: f64 = 13.0;
/// Space between two rows, in pixels.
const ROW_GAP_PX: f64 = 10.0;
/// Left margin of the title, in pixels.
const MARGIN_PX: f64 = 8.0;
/// Baseline of the title, in pixels from the top.
const TITLE_BASELINE_PX: f64 = 20.0;
/// Top of the legend's box, in pixels from the top: under the title, above the rows, so
/// nothing else is ever drawn where it is.
const LEGEND_TOP_PX: f64 = 30.0;
/// Space between the legend's box and what it holds, in pixels.
const LEGEND_PAD_PX: f64 = 4.0;
/// Height of one line of the legend, in pixels.
const LEGEND_LINE_PX: f64 = 18.0;
/// Space between two entries of the legend, in pixels.
const LEGEND_GAP_PX: f64 = 24.0;
/// Space between the legend's box and the first row, in pixels.
const LEGEND_BELOW_PX: f64 = 12.0;
/// Side of a legend entry's colour square, in pixels.
const SWATCH_PX: f64 = 12.0;
/// Space between a legend entry's square and its name, in pixels.
const SWATCH_GAP_PX: f64 = 4.0;
/// Length of an axis tick below the axis, in pixels.
const TICK_PX: f64 = 4.0;
/// From the axis to the baseline of its tick labels, in pixels.
const TICK_LABEL_PX: f64 = 16.0;
/// From the tick labels' baseline to the axis caption's, in pixels.
const CAPTION_PX: f64 = 20.0;
/// Font size of the chart's text (row labels, legend, axis caption), in pixels.
const FONT_PX: f64 = 12.0;
/// Font size of the title, in pixels.
const TITLE_FONT_PX: f64 = 14.0;
/// Font size of the figures beside the bars and of the tick labels, in pixels.
const SMALL_FONT_PX: f64 = 10.0;
/// A generous mean width of a sans-serif character, as a share of the font size: the viewer
/// draws the text with a font of its own, so the layout reserves room by estimate.
const CHAR_EM: f64 = 0.62;
/// Largest max/min of one chart's values drawn on a linear axis: beyond it the smallest rows'
/// bars would be a pixel or two long, so the axis is logarithmic.
const LINEAR_SPAN_MAX: f64 = 100.0;
/// The least room a log axis leaves below its smallest value, in decades (a factor of 2), so
/// that value's bar is not a sliver.
const LOG_ROOM_DECADES: f64 = 0.3;
/// Ticks a linear axis aims at.
const LINEAR_TICKS: f64 = 5.0;
/// Colours of the busway bar and the raw bar.
const COLOURS: [&str; 2] = ["#1f6fb2", "#9a9a9a"];
/// Colour of the axis, its ticks and their labels.
const AXIS_COLOUR: &str = "#333333";
/// Colour of the grid lines through the rows and of the legend's frame.
const GRID_COLOUR: &str = "#e4e4e4";

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

/// How a value maps to a bar's length.
#[derive(Debug, PartialEq)]
enum Scale {
    /// 0..=`max`, evenly.
    Linear { max: f64 },
    /// Decades 10^`lo`..=10^`hi`, each as long as the next.
    Log { lo: i32, hi: i32 },
}

impl Scale {
    /// The scale of a chart with these values: logarithmic when its positive ones span more
    /// than `LINEAR_SPAN_MAX`, linear otherwise.
    fn of(values: impl Iterator<Item = f64>) -> Scale {
        let (min, max) = values
            .filter(|v| v.is_finite() && *v > 0.0)
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            });
        if max == 0.0 {
            // All zero (or missing): no bar has a length.
            return Scale::Linear { max: 1.0 };
        }
        if max / min <= LINEAR_SPAN_MAX {
            return Scale::Linear { max };
        }
        // From a decade far enough below the smallest value that its bar shows, to the one
        // at or above the largest (a hair off, so that an exact power of ten is its own).
        Scale::Log {
            lo: (min.log10() - LOG_ROOM_DECADES).floor() as i32,
            hi: (max.log10() - 1e-9).ceil() as i32,
        }
    }

    /// The share of the plot's width a bar of `v` takes, 0..=1 (0 for a missing value).
    fn share(&self, v: f64) -> f64 {
        if !v.is_finite() || v <= 0.0 {
            return 0.0;
        }
        let share = match *self {
            Scale::Linear { max } => v / max,
            Scale::Log { lo, hi } => (v.log10() - f64::from(lo)) / f64::from(hi - lo),
        };
        share.clamp(0.0, 1.0)
    }

    /// The axis's ticks: (value, label); a log axis has one per decade.
    fn ticks(&self) -> Vec<(f64, String)> {
        match *self {
            Scale::Log { lo, hi } => (lo..=hi)
                .map(|k| (10f64.powi(k), decade_label(k)))
                .collect(),
            Scale::Linear { max } => {
                let step = nice_step(max / LINEAR_TICKS);
                let decimals = (-step.log10().floor()).max(0.0) as usize;
                (0..)
                    .map(|i| f64::from(i) * step)
                    .take_while(|v| *v <= max * (1.0 + 1e-9))
                    .map(|v| (v, format!("{v:.decimals$}")))
                    .collect()
            }
        }
    }
}

/// The step of 1, 2 or 5 times a power of ten nearest above `rough`.
fn nice_step(rough: f64) -> f64 {
    let power = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .find(|m| m * power >= rough)
        .unwrap_or(10.0);
    step * power
}

/// 10^`k` written out: 0.01, 0.1, 1, 10, ... 1000000; beyond, 1e7.
fn decade_label(k: i32) -> String {
    match k {
        0..=6 => 10u64.pow(k.unsigned_abs()).to_string(),
        -4..=-1 => format!("{:.*}", k.unsigned_abs() as usize, 10f64.powi(k)),
        _ => format!("1e{k}"),
    }
}

/// The room `text` takes at `font_px`, by estimate (see `CHAR_EM`), in pixels.
fn text_px(text: &str, font_px: f64) -> f64 {
    text.chars().count() as f64 * font_px * CHAR_EM
}

/// An area of the chart, in pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Area {
    left: f64,
    top: f64,
    right: f64,
    bottom: f64,
}

/// Where the legend's entries go (the top left of each one's square), and the box that holds
/// them: from the rows' left edge, wrapping to a new line when an entry would pass the chart's
/// right edge.
fn legend_layout(series: &[String; 2]) -> (Vec<(f64, f64)>, Area) {
    let left = LABEL_PX + LEGEND_PAD_PX;
    let (mut x, mut y, mut right) = (left, LEGEND_TOP_PX + LEGEND_PAD_PX, left);
    let mut at = Vec::new();
    for name in series {
        let w = SWATCH_PX + SWATCH_GAP_PX + text_px(name, FONT_PX);
        if x > left && x + w > WIDTH_PX - MARGIN_PX {
            x = left;
            y += LEGEND_LINE_PX;
        }
        at.push((x, y));
        right = right.max(x + w);
        x += w + LEGEND_GAP_PX;
    }
    let area = Area {
        left: LABEL_PX,
        top: LEGEND_TOP_PX,
        right: right + LEGEND_PAD_PX,
        bottom: y + LEGEND_LINE_PX + LEGEND_PAD_PX,
    };
    (at, area)
}

/// The chart as an SVG document: the title, the legend, the rows, the axis under them and the
/// axis caption under it, each in a band of its own.
fn render(chart: &Chart) -> String {
    let scale = Scale::of(chart.rows.iter().flat_map(|&(_, a, b)| [a, b]));
    let (entries, legend) = legend_layout(&chart.series);
    let rows_top = legend.bottom + LEGEND_BELOW_PX;
    let row_px = 2.0 * BAR_PX + ROW_GAP_PX;
    let axis_y = rows_top + row_px * chart.rows.len() as f64 + ROW_GAP_PX;
    let caption_y = axis_y + TICK_LABEL_PX + CAPTION_PX;
    let height = caption_y + ROW_GAP_PX;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH_PX}" height="{height}" viewBox="0 0 {WIDTH_PX} {height}" font-family="sans-serif" font-size="{FONT_PX}">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{MARGIN_PX}" y="{TITLE_BASELINE_PX}" font-size="{TITLE_FONT_PX}" font-weight="bold">{}</text>"#,
        escape(&chart.title)
    );
    write_legend(&mut s, &chart.series, &entries, legend);
    write_grid(&mut s, &scale, rows_top, axis_y);
    for (r, row) in chart.rows.iter().enumerate() {
        write_row(&mut s, &scale, rows_top + row_px * r as f64, row);
    }
    write_axis(&mut s, &scale, axis_y);
    let better = if chart.lower_is_better {
        "shorter is better"
    } else {
        "longer is better"
    };
    let log = match scale {
        Scale::Log { .. } => "; log scale, one tick per decade",
        Scale::Linear { .. } => "",
    };
    let _ = writeln!(
        s,
        r#"<text id="caption" x="{LABEL_PX}" y="{caption_y}">{} ({better}{log})</text>"#,
        escape(chart.unit)
    );
    s.push_str("</svg>\n");
    s
}

/// The legend: a box, and in it a square of each series' colour beside its name.
fn write_legend(s: &mut String, series: &[String; 2], entries: &[(f64, f64)], area: Area) {
    let _ = write!(
        s,
        r#"<rect id="legend" x="{}" y="{}" width="{:.1}" height="{}" fill="white" stroke="{GRID_COLOUR}"/>"#,
        area.left,
        area.top,
        area.right - area.left,
        area.bottom - area.top
    );
    for (i, (name, &(x, y))) in series.iter().zip(entries).enumerate() {
        let _ = write!(
            s,
            r#"<rect x="{x:.1}" y="{}" width="{SWATCH_PX}" height="{SWATCH_PX}" fill="{}"/><text x="{:.1}" y="{}">{}</text>"#,
            y + 2.0,
            COLOURS[i],
            x + SWATCH_PX + SWATCH_GAP_PX,
            y + FONT_PX,
            escape(name)
        );
    }
    s.push('\n');
}

/// A light line through the rows at each tick, so a bar can be read against the axis.
fn write_grid(s: &mut String, scale: &Scale, top: f64, axis_y: f64) {
    for (v, _) in scale.ticks() {
        let x = LABEL_PX + scale.share(v) * PLOT_PX;
        let _ = write!(
            s,
            r#"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{axis_y}" stroke="{GRID_COLOUR}"/>"#
        );
    }
    s.push('\n');
}

/// One row at `top`: its label, then busway's bar and the raw one, each with its figure.
fn write_row(s: &mut String, scale: &Scale, top: f64, (label, bus, raw): &(String, f64, f64)) {
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
        LABEL_PX - 8.0,
        top + BAR_PX + 4.0,
        escape(label)
    );
    for (i, v) in [*bus, *raw].into_iter().enumerate() {
        let y = top + BAR_PX * i as f64;
        let w = scale.share(v) * PLOT_PX;
        let _ = write!(
            s,
            r#"<rect x="{LABEL_PX}" y="{y}" width="{w:.1}" height="{}" fill="{}"/><text x="{:.1}" y="{}" font-size="{SMALL_FONT_PX}">{}</text>"#,
            BAR_PX - 1.0,
            COLOURS[i],
            LABEL_PX + w + 4.0,
            y + BAR_PX - 3.0,
            figure(v)
        );
    }
    s.push('\n');
}

/// The axis under the rows: its line, and a labelled tick at each of `scale`'s ticks.
fn write_axis(s: &mut String, scale: &Scale, y: f64) {
    let _ = write!(
        s,
        r#"<line x1="{LABEL_PX}" y1="{y}" x2="{}" y2="{y}" stroke="{AXIS_COLOUR}"/>"#,
        LABEL_PX + PLOT_PX
    );
    for (v, label) in scale.ticks() {
        let x = LABEL_PX + scale.share(v) * PLOT_PX;
        let _ = write!(
            s,
            r#"<line x1="{x:.1}" y1="{y}" x2="{x:.1}" y2="{}" stroke="{AXIS_COLOUR}"/><text class="tick" x="{x:.1}" y="{}" text-anchor="middle" font-size="{SMALL_FONT_PX}" fill="{AXIS_COLOUR}">{label}</text>"#,
            y + TICK_PX,
            y + TICK_LABEL_PX
        );
    }
    s.push('\n');
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

    /// The number in attribute `name` of the SVG element that begins `tag`.
    fn attr(tag: &str, name: &str) -> f64 {
        let at = tag.find(&format!(" {name}=\"")).expect(name) + name.len() + 3;
        tag[at..].split('"').next().unwrap().parse().expect(name)
    }

    /// The SVG from element `id` on.
    fn element<'a>(svg: &'a str, id: &str) -> &'a str {
        let at = svg
            .find(&format!("id=\"{id}\""))
            .unwrap_or_else(|| panic!("no {id}: {svg}"));
        &svg[svg[..at].rfind('<').unwrap()..]
    }

    /// The room a `<text>` element at the start of `tag` takes, by the chart's own estimate.
    fn text_area(tag: &str, font_px: f64) -> Area {
        let text = &tag[tag.find('>').unwrap() + 1..tag.find("</text>").unwrap()];
        let (x, y) = (attr(tag, "x"), attr(tag, "y"));
        Area {
            left: x,
            top: y - font_px,
            right: x + text_px(text, font_px),
            bottom: y + font_px * 0.3,
        }
    }

    fn overlap(a: Area, b: Area) -> bool {
        a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom
    }

    /// The labels of the axis's ticks, left to right.
    fn tick_labels(svg: &str) -> Vec<&str> {
        svg.split(r#"<text class="tick""#)
            .skip(1)
            .map(|t| &t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()])
            .collect()
    }

    #[test]
    fn bars_are_scaled_to_the_largest_value_and_text_is_escaped() {
        let svg = render(&chart(vec![
            ("tcp4 8-128".into(), 10.0, 5.0),
            ("shm 8-128".into(), 2.0, 20.0),
        ]));
        assert!(svg.contains(&format!(r#"width="{:.1}""#, PLOT_PX)), "{svg}");
        assert!(
            svg.contains(&format!(r#"width="{:.1}""#, PLOT_PX / 2.0)),
            "{svg}"
        );
        assert!(
            svg.contains(&format!(r#"width="{:.1}""#, PLOT_PX / 10.0)),
            "{svg}"
        );
        assert!(svg.contains("a &lt;title&gt; &amp; more"));
        assert!(!svg.contains("<title>"));
        // Two bars of each colour, and the legend's square of each.
        for colour in COLOURS {
            assert_eq!(svg.matches(&format!(r#"fill="{colour}""#)).count(), 3);
        }
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn a_missing_or_zero_value_draws_no_bar_and_no_nan() {
        let svg = render(&chart(vec![("x".into(), f64::NAN, 0.0)]));
        assert!(!svg.contains("NaN"), "{svg}");
        assert!(!svg.contains("inf"));
    }

    #[test]
    fn the_legend_overlaps_neither_the_axis_caption_nor_the_rows_with_long_labels() {
        let mut c = chart(vec![
            ("relay4 10000 x 16384 B loops 2".into(), 1460.0, 356.0),
            ("tcp4 1 x 4096 B loops 0".into(), 46.0, 64.0),
        ]);
        c.unit = "MiB/s the client receives, median of three rounds of a long run";
        c.series = [
            "busway, one link between the two nodes carrying every session".into(),
            "raw (epoll echo client and server, N connections, one loop per thread)".into(),
        ];
        let svg = render(&c);
        let legend = element(&svg, "legend");
        let legend = Area {
            left: attr(legend, "x"),
            top: attr(legend, "y"),
            right: attr(legend, "x") + attr(legend, "width"),
            bottom: attr(legend, "y") + attr(legend, "height"),
        };
        let caption = text_area(element(&svg, "caption"), FONT_PX);
        assert!(!overlap(legend, caption), "{legend:?} {caption:?}\n{svg}");
        // Each entry's name is inside the legend's box, and the box ends above the first bar.
        for name in &c.series {
            let tag = &svg[svg[..svg.find(name.as_str()).unwrap()]
                .rfind("<text")
                .unwrap()..];
            let text = text_area(tag, FONT_PX);
            assert!(
                text.left >= legend.left && text.right <= legend.right,
                "{text:?} {legend:?}"
            );
            assert!(
                text.top >= legend.top && text.bottom <= legend.bottom,
                "{text:?} {legend:?}"
            );
        }
        let first_bar = &svg[svg.find(&format!(r#"<rect x="{LABEL_PX}""#)).unwrap()..];
        assert!(legend.bottom < attr(first_bar, "y"), "{svg}");
    }

    #[test]
    fn values_spanning_1_to_10000_get_a_log_axis_with_labelled_decades() {
        let c = chart(vec![("a".into(), 1.0, 10.0), ("b".into(), 100.0, 10_000.0)]);
        assert_eq!(
            Scale::of(c.rows.iter().flat_map(|r| [r.1, r.2])),
            Scale::Log { lo: -1, hi: 4 }
        );
        let svg = render(&c);
        assert_eq!(
            tick_labels(&svg),
            ["0.1", "1", "10", "100", "1000", "10000"],
            "{svg}"
        );
        // Each decade is as long as the next: 1 is one fifth of the way, 100 three fifths.
        for (v, share) in [(1.0, 0.2), (100.0, 0.6), (10_000.0, 1.0)] {
            let w = format!(r#"width="{:.1}""#, share * PLOT_PX);
            assert!(svg.contains(&w), "{v}: {w}\n{svg}");
        }
        assert!(svg.contains("log scale"), "{svg}");
    }

    #[test]
    fn a_log_axis_leaves_the_smallest_bar_room() {
        let scale = |min: f64| Scale::of([min, 500.0].into_iter());
        assert_eq!(scale(1.05), Scale::Log { lo: -1, hi: 3 });
        assert_eq!(scale(2.5), Scale::Log { lo: 0, hi: 3 });
        assert!(scale(1.05).share(1.05) > 0.2);
    }

    #[test]
    fn values_within_a_hundredfold_get_a_linear_axis_from_zero() {
        let c = chart(vec![("a".into(), 2.0, 150.0)]);
        assert_eq!(
            Scale::of(c.rows.iter().flat_map(|r| [r.1, r.2])),
            Scale::Linear { max: 150.0 }
        );
        let svg = render(&c);
        assert_eq!(tick_labels(&svg), ["0", "50", "100", "150"], "{svg}");
        assert!(!svg.contains("log scale"), "{svg}");
        assert_eq!(
            Scale::Linear { max: 0.9 }
                .ticks()
                .iter()
                .map(|t| t.1.as_str())
                .collect::<Vec<_>>(),
            ["0.0", "0.2", "0.4", "0.6", "0.8"]
        );
    }
}
