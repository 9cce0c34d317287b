//! The HTML report (`--html`): one self-contained file with the summary, the tables and
//! hand-written inline SVG plots — throughput over time by status class, the latency
//! percentile curve on log scales, and the server's memory when it was measured.

use std::fmt::Write as _;

use crate::cli::Strategy;
use crate::compare::{self, CompareReport};
use crate::report::{human_us, BenchResult};
use crate::stats::CurvePoint;

/// Plot size in SVG user units (pixels at 100% zoom).
const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 330.0;
const MARGIN_LEFT: f64 = 72.0;
const MARGIN_RIGHT: f64 = 20.0;
const MARGIN_TOP: f64 = 52.0;
const MARGIN_BOTTOM: f64 = 46.0;
/// Height of one row of the legend; a legend wider than the chart wraps onto more rows,
/// and the plot moves down by as much.
const LEGEND_ROW: f64 = 16.0;
/// Series with at most this many points get a marker on each point (a run of one second
/// would otherwise draw an invisible line of one point).
const MARKERS_MAX_POINTS: usize = 60;
/// Deepest "nines" the latency plot's axis shows: 99.999%.
const NINES_AXIS_MAX: f64 = 5.0;
/// Where the latency plot puts the maximum (100%, infinitely many nines): half a decade
/// right of the deepest percentile, under its own "max" tick.
const MAX_AT_NINES: f64 = NINES_AXIS_MAX + 0.5;

/// Escapes text for XML/HTML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// How an axis maps values to positions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    Linear,
    /// Base-10 logarithmic; values ≤ 0 are not drawn.
    Log,
}

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub color: &'static str,
    /// Drawn dashed (a line that often lies on another, like orders on 2xx).
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_scale: Scale,
    pub y_scale: Scale,
    /// Fixed x ticks (value, label); computed when empty.
    pub x_ticks: Vec<(f64, String)>,
    /// Formats a y tick value.
    pub y_format: fn(f64) -> String,
    pub series: Vec<Series>,
}

fn transform(scale: Scale, v: f64) -> Option<f64> {
    match scale {
        Scale::Linear => v.is_finite().then_some(v),
        Scale::Log => (v > 0.0 && v.is_finite()).then(|| v.log10()),
    }
}

/// "Nice" linear ticks covering [0, max]: steps of 1, 2 or 5 × 10^k, about five of them.
pub fn linear_ticks(max: f64) -> Vec<f64> {
    if max <= 0.0 || !max.is_finite() {
        return vec![0.0, 1.0];
    }
    let raw = max / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    // max / step ≤ 5 by the choice of step, so at most 6 ticks (the last above the
    // data); 12 is a safety bound against floating-point surprises.
    (0..12)
        .map(|i| f64::from(i) * step)
        .take_while(|t| *t < max + step)
        .collect()
}

/// Decade ticks (10^k) covering [min, max] for a log axis (positive values).
pub fn log_ticks(min: f64, max: f64) -> Vec<f64> {
    if !(min > 0.0 && max >= min && max.is_finite()) {
        return vec![1.0, 10.0];
    }
    let lo = min.log10().floor() as i32;
    let hi = (max.log10().ceil() as i32).max(lo + 1);
    (lo..=hi).map(|e| 10f64.powi(e)).collect()
}

/// Renders a chart as a standalone `<svg>` element.
pub fn render_chart(chart: &Chart) -> String {
    let names: Vec<&str> = chart.series.iter().map(|s| s.name.as_str()).collect();
    let legend = legend_layout(&names);
    let frame = Frame::of(chart, &legend);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" font-family="system-ui, sans-serif" font-size="12" role="img" aria-label="{title}">"#,
        height = frame.height,
        title = escape(&chart.title)
    );
    let _ = write!(
        s,
        r##"<rect x="0" y="0" width="{WIDTH}" height="{}" fill="#ffffff"/><text x="{MARGIN_LEFT}" y="20" font-size="15" font-weight="600" fill="#222">{}</text>"##,
        frame.height,
        escape(&chart.title)
    );
    frame.axes(&mut s, chart);
    for (series, &(legend_x, row)) in chart.series.iter().zip(&legend) {
        frame.series(&mut s, chart, series);
        // Legend entry.
        let _ = write!(
            s,
            r##"<rect x="{legend_x:.1}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}" fill="#333">{}</text>"##,
            32.0 + row as f64 * LEGEND_ROW,
            series.color,
            legend_x + 16.0,
            42.0 + row as f64 * LEGEND_ROW,
            escape(&series.name)
        );
    }
    s.push_str("</svg>");
    s
}

/// A chart's geometry: its height (grown by the legend's extra rows), the plot's place,
/// the ticks, and the axes' ranges in transformed space.
struct Frame {
    height: f64,
    /// The plot's top edge.
    top: f64,
    plot_w: f64,
    plot_h: f64,
    x_ticks: Vec<(f64, String)>,
    y_ticks: Vec<f64>,
    x_range: (f64, f64),
    y_range: (f64, f64),
}

impl Frame {
    fn of(chart: &Chart, legend: &[(f64, usize)]) -> Frame {
        let legend_extra =
            legend.iter().map(|&(_, row)| row).max().unwrap_or(0) as f64 * LEGEND_ROW;
        let top = MARGIN_TOP + legend_extra;
        let height = HEIGHT + legend_extra;
        let all: Vec<(f64, f64)> = chart
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|&(x, y)| {
                transform(chart.x_scale, x).is_some() && transform(chart.y_scale, y).is_some()
            })
            .collect();
        let x_ticks: Vec<(f64, String)> = if chart.x_ticks.is_empty() {
            let max = all.iter().map(|p| p.0).fold(0.0, f64::max);
            linear_ticks(max)
                .into_iter()
                .map(|t| (t, number(t)))
                .collect()
        } else {
            chart.x_ticks.clone()
        };
        let y_ticks: Vec<f64> = match chart.y_scale {
            Scale::Linear => linear_ticks(all.iter().map(|p| p.1).fold(0.0, f64::max)),
            Scale::Log => {
                let min = all.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
                let max = all.iter().map(|p| p.1).fold(0.0, f64::max);
                log_ticks(min, max)
            }
        };
        Frame {
            height,
            top,
            plot_w: WIDTH - MARGIN_LEFT - MARGIN_RIGHT,
            plot_h: height - top - MARGIN_BOTTOM,
            x_range: tick_range(x_ticks.iter().map(|t| t.0), chart.x_scale),
            y_range: tick_range(y_ticks.iter().copied(), chart.y_scale),
            x_ticks,
            y_ticks,
        }
    }

    /// Where a transformed x value is drawn.
    fn px(&self, x: f64) -> f64 {
        let (x0, x1) = self.x_range;
        MARGIN_LEFT + (x - x0) / (x1 - x0) * self.plot_w
    }

    /// Where a transformed y value is drawn.
    fn py(&self, y: f64) -> f64 {
        let (y0, y1) = self.y_range;
        self.top + self.plot_h - (y - y0) / (y1 - y0) * self.plot_h
    }

    /// The grid with its tick labels, the plot's border and the axes' labels.
    fn axes(&self, s: &mut String, chart: &Chart) {
        let (top, plot_w, plot_h) = (self.top, self.plot_w, self.plot_h);
        for &t in &self.y_ticks {
            let Some(v) = transform(chart.y_scale, t) else {
                continue;
            };
            let y = self.py(v);
            let _ = write!(
                s,
                r##"<line x1="{MARGIN_LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">{}</text>"##,
                MARGIN_LEFT + plot_w,
                MARGIN_LEFT - 6.0,
                y + 4.0,
                escape(&(chart.y_format)(t))
            );
        }
        for (t, label) in &self.x_ticks {
            let Some(v) = transform(chart.x_scale, *t) else {
                continue;
            };
            let x = self.px(v);
            let _ = write!(
                s,
                r##"<line x1="{x:.1}" x2="{x:.1}" y1="{top}" y2="{:.1}" stroke="#efefef"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
                top + plot_h,
                top + plot_h + 16.0,
                escape(label)
            );
        }
        let _ = write!(
            s,
            r##"<rect x="{MARGIN_LEFT}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>"##
        );
        let _ = write!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#333">{}</text>"##,
            MARGIN_LEFT + plot_w / 2.0,
            self.height - 8.0,
            escape(&chart.x_label)
        );
        let _ = write!(
            s,
            r##"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle" fill="#333">{}</text>"##,
            top + plot_h / 2.0,
            escape(&chart.y_label)
        );
    }

    /// One series: its line, its points' markers when they are few, its title.
    fn series(&self, s: &mut String, chart: &Chart, series: &Series) {
        let pts: Vec<(f64, f64)> = series
            .points
            .iter()
            .filter_map(|&(x, y)| {
                Some((
                    self.px(transform(chart.x_scale, x)?),
                    self.py(transform(chart.y_scale, y)?),
                ))
            })
            .collect();
        let _ = write!(
            s,
            r#"<g class="series" data-name="{}">"#,
            escape(&series.name)
        );
        let list: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" stroke-linejoin="round"{} points="{}"/>"#,
            series.color,
            if series.dashed {
                r#" stroke-dasharray="6 4""#
            } else {
                ""
            },
            list.join(" ")
        );
        if pts.len() <= MARKERS_MAX_POINTS {
            for (x, y) in &pts {
                let _ = write!(
                    s,
                    r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.5" fill="{}"/>"#,
                    series.color
                );
            }
        }
        let _ = write!(s, "<title>{}</title></g>", escape(&series.name));
    }
}

/// An axis's range in transformed space, from its ticks; (0, 1) when they give none.
fn tick_range(ticks: impl Iterator<Item = f64>, scale: Scale) -> (f64, f64) {
    let t: Vec<f64> = ticks.filter_map(|v| transform(scale, v)).collect();
    let lo = t.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = t.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if lo.is_finite() && hi > lo {
        (lo, hi)
    } else {
        (0.0, 1.0)
    }
}

/// Where each legend entry goes, `(x, row)`: entries side by side (a swatch, the name at
/// about 7.2 units a character, a gap), wrapped onto a new row before one would run past
/// the chart's right edge.
fn legend_layout(names: &[&str]) -> Vec<(f64, usize)> {
    let mut out = Vec::with_capacity(names.len());
    let (mut x, mut row) = (MARGIN_LEFT, 0);
    for name in names {
        let drawn = 16.0 + 7.2 * name.chars().count() as f64;
        if x > MARGIN_LEFT && x + drawn > WIDTH - 4.0 {
            x = MARGIN_LEFT;
            row += 1;
        }
        out.push((x, row));
        x += drawn + 12.0;
    }
    out
}

/// A tick value without floating-point noise: at most 3 decimals, trailing zeros cut.
pub fn number(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_owned()
    } else {
        s.to_owned()
    }
}

fn count_format(v: f64) -> String {
    if v >= 1000.0 {
        format!("{}k", number(v / 1000.0))
    } else {
        number(v)
    }
}

/// A latency tick: "500µs", "1ms", "20ms", "1.5s".
fn micros_format(v: f64) -> String {
    if v < 1000.0 {
        format!("{}µs", number(v))
    } else if v < 1_000_000.0 {
        format!("{}ms", number(v / 1000.0))
    } else {
        format!("{}s", number(v / 1_000_000.0))
    }
}

fn mb_format(v: f64) -> String {
    format!("{} MB", number(v))
}

/// A timeline step's point on a per-second chart: its count divided by the part of its
/// step the load covered, drawn at that part's middle. A run's last step is mostly
/// partial: counted as a whole step, it would read as a drop, or as a rate the run never
/// had. A last part under a tenth of a step counts as a tenth, so that a few late answers
/// don't read as a spike; a run that ended within its first step is its own rate however
/// short it was.
fn rate_point(
    bucket: &crate::stats::Bucket,
    step_ms: u64,
    count: u64,
    elapsed_s: f64,
) -> (f64, f64) {
    let start = bucket.start_ms as f64 / 1e3;
    let step = step_ms.max(1) as f64 / 1e3;
    let floor = if bucket.start_ms == 0 {
        1e-3
    } else {
        step / 10.0
    };
    let covered = (elapsed_s - start).clamp(floor, step);
    (start + covered / 2.0, count as f64 / covered)
}

/// Answers per second over time, one line per status class (plus orders and drops).
pub fn throughput_chart(r: &BenchResult) -> Chart {
    type Pick = fn(&crate::stats::Bucket) -> u64;
    let lines: [(&str, &'static str, Pick, bool); 7] = [
        (
            "all answers",
            "#444444",
            |b| b.ok + b.rejected + b.unavailable + b.transport_errors,
            true,
        ),
        ("2xx", "#2a9d4b", |b| b.ok, true),
        ("4xx rejected", "#e08a00", |b| b.rejected, true),
        ("orders (201)", "#1f5fbf", |b| b.orders, true),
        ("5xx", "#d62728", |b| b.unavailable, false),
        ("no answer", "#7f3fbf", |b| b.transport_errors, false),
        ("dropped", "#777777", |b| b.dropped, false),
    ];
    let series = lines
        .iter()
        .filter(|(_, _, pick, always)| *always || r.timeline.iter().any(|b| pick(b) > 0))
        .map(|(name, color, pick, _)| Series {
            name: (*name).to_owned(),
            color,
            dashed: *name == "orders (201)",
            points: r
                .timeline
                .iter()
                .map(|b| rate_point(b, r.timeline_step_ms, pick(b), r.elapsed_s))
                .collect(),
        })
        .collect();
    Chart {
        title: "Throughput over time (answers per second, by status class)".into(),
        x_label: "seconds since the start of the load".into(),
        y_label: "per second".into(),
        x_scale: Scale::Linear,
        y_scale: Scale::Linear,
        x_ticks: Vec::new(),
        y_format: count_format,
        series,
    }
}

const OP_COLORS: [&str; 4] = ["#1f5fbf", "#2a9d4b", "#d62728", "#7f3fbf"];
/// Colours of a comparison's runs, in row order (ceiling, http-post-ceiling,
/// sql-conditional, db-pessimistic, db-conditional, db-optimistic, redis-lock,
/// redis-lua, flashsale; cycled beyond, so the second ceiling run is the first one's
/// grey).
const RUN_COLORS: [&str; 9] = [
    "#444444", "#8c8c8c", "#8c564b", "#d62728", "#e08a00", "#2a9d4b", "#17becf", "#7f3fbf",
    "#1f5fbf",
];

/// Maps a percentile (0–100, below 100) to the "nines" axis: 90% → 1, 99% → 2, …
pub fn nines(percentile: f64) -> f64 {
    -(1.0 - percentile / 100.0).log10()
}

/// The latency percentile curve of each kind of request, latency on a log scale against
/// the percentile on the "nines" axis (0%, 90%, 99%, 99.9%, …).
pub fn latency_chart(r: &BenchResult) -> Chart {
    let series = r
        .ops
        .iter()
        .zip(OP_COLORS.iter().cycle())
        .filter(|(o, _)| o.latency.count > 0)
        .map(|(o, color)| Series {
            name: format!("{} (max {})", o.op, human_us(o.latency.max_us)),
            color,
            dashed: false,
            points: curve_points(&o.curve),
        })
        .collect();
    latency_axes("Latency distribution (percentile curve, log scale)", series)
}

/// A latency percentile chart: the "nines" x axis, latency on a log y axis.
fn latency_axes(title: &str, series: Vec<Series>) -> Chart {
    let labels = ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"];
    Chart {
        title: title.into(),
        x_label: "percentile of requests".into(),
        y_label: "latency (at most)".into(),
        x_scale: Scale::Linear,
        y_scale: Scale::Log,
        x_ticks: labels
            .iter()
            .enumerate()
            .map(|(i, l)| (i as f64, (*l).to_owned()))
            .chain([(MAX_AT_NINES, "max".to_owned())])
            .collect(),
        y_format: micros_format,
        series,
    }
}

fn curve_points(curve: &[CurvePoint]) -> Vec<(f64, f64)> {
    curve
        .iter()
        .map(|p| {
            let x = if p.percentile >= 100.0 {
                MAX_AT_NINES
            } else {
                nines(p.percentile).min(NINES_AXIS_MAX)
            };
            (x, p.micros as f64)
        })
        .collect()
}

/// The server's resident memory over time, when it was measured.
pub fn memory_chart(r: &BenchResult) -> Option<Chart> {
    let points: Vec<(f64, f64)> = r
        .timeline
        .iter()
        .filter_map(|b| {
            b.rss_kb
                .map(|kb| (b.start_ms as f64 / 1e3, kb as f64 / 1024.0))
        })
        .collect();
    if points.is_empty() {
        return None;
    }
    Some(Chart {
        title: "Server resident memory (VmRSS, the highest in each step)".into(),
        x_label: "seconds since the start of the load".into(),
        y_label: "MB".into(),
        x_scale: Scale::Linear,
        y_scale: Scale::Linear,
        x_ticks: Vec::new(),
        y_format: mb_format,
        series: vec![Series {
            name: "VmRSS".into(),
            color: "#1f5fbf",
            dashed: false,
            points,
        }],
    })
}

fn row(out: &mut String, cells: &[String]) {
    out.push_str("<tr>");
    for c in cells {
        let _ = write!(out, "<td>{}</td>", escape(c));
    }
    out.push_str("</tr>");
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| v.to_string())
}

fn opt_f(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.3}"))
}

/// The page's head and title, up to the first heading. `when` (the run's start) ends
/// the heading on a line of its own, never broken inside.
fn page_start(h: &mut String, title: &str, when: &str) {
    let _ = write!(
        h,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{} — {}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 900px; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }}
td, th {{ border: 1px solid #ddd; padding: 3px 8px; text-align: right; }}
th {{ background: #f4f4f4; }} td:first-child, th:first-child {{ text-align: left; }}
.verdict {{ padding: 0.6em 1em; font-weight: 600; border-radius: 4px; }}
.pass {{ background: #e3f6e8; color: #14532d; }} .fail {{ background: #fde2e2; color: #7f1d1d; }} .info {{ background: #eef2f7; color: #1e293b; }}
.kpi {{ display: inline-block; margin: 0 1.5em 1em 0; }} .kpi b {{ display: block; font-size: 1.6em; }}
pre {{ background: #f7f7f7; padding: 0.8em; font-size: 12px; white-space: pre-wrap; overflow-wrap: anywhere; }}
h1 .when {{ display: block; font-size: 0.55em; font-weight: normal; color: #555; white-space: nowrap; }}
figure {{ margin: 1em 0; }}
.compare {{ font-size: 12px; }} .compare th {{ white-space: normal; max-width: 7.5em; vertical-align: bottom; }}
.compare td, .compare th {{ padding: 2px 5px; }}
</style></head><body>
<h1>{}<span class="when">{}</span></h1>
"#,
        escape(title),
        escape(when),
        escape(title),
        escape(when)
    );
}

/// The orders' headline figure: orders per second over the run, or, when every order was
/// made early in it (a rush, whose stock is gone in its first fraction of a second),
/// how many and within what time, which a rate over the whole run would hide.
fn orders_kpi(r: &BenchResult) -> (String, String) {
    match crate::report::orders_made_within(r) {
        Some(secs) => (
            "orders made (then none left to sell)".to_owned(),
            format!("{} in {secs:.2} s", r.orders.created),
        ),
        None => (
            "orders/s".to_owned(),
            format!("{:.0}", r.throughput.orders_per_s),
        ),
    }
}

/// The whole report.
pub fn report(r: &BenchResult) -> String {
    let mut h = String::new();
    let title = if r.is_ceiling() {
        format!("flashsale-bench {} — HTTP ceiling", r.scenario)
    } else {
        format!("flashsale-bench {} — {}", r.scenario, r.label())
    };
    page_start(&mut h, &title, &r.started_at);
    verdict_and_kpis(&mut h, r);
    let _ = write!(
        h,
        "<figure>{}</figure><figure>{}</figure>",
        render_chart(&throughput_chart(r)),
        render_chart(&latency_chart(r))
    );
    latency_table(&mut h, r);
    answers_tables(&mut h, r);
    if r.targets.len() > 1 {
        targets_table(&mut h, r);
    }
    attempts_table(&mut h, r);
    costs_tables(&mut h, r);
    if let Some(chart) = memory_chart(r) {
        let _ = write!(h, "<figure>{}</figure>", render_chart(&chart));
    }
    h.push_str("<h2>Checks</h2><ul>");
    check_items(&mut h, &r.checks);
    let _ = write!(
        h,
        "</ul><p>audit: <b>{}</b> ({} run(s))</p><pre>{}</pre>",
        escape(&r.checks.audit.status),
        r.checks.audit.runs,
        escape(&r.checks.audit.output)
    );
    page_end(&mut h, &r.config);
    h
}

/// The verdict line and the headline figures.
fn verdict_and_kpis(h: &mut String, r: &BenchResult) {
    let _ = write!(
        h,
        r#"<p class="verdict {}">{}</p>"#,
        match (r.passed, r.judged()) {
            (true, true) => "pass",
            (true, false) => "info",
            (false, _) => "fail",
        },
        match (r.passed, r.judged()) {
            (true, true) => "PASS — no invariant violation (client checks and audit)",
            (true, false) => "NOT JUDGED — a ceiling run makes no order: it measures the HTTP path, no invariant is checked",
            (false, _) => "FAIL — invariant violations, see the checks below",
        }
    );
    let main = r.main_op();
    let op = &r.config.target;
    let kpis = [
        (
            "answers/s".to_owned(),
            format!("{:.0}", r.throughput.answers_per_s),
        ),
        orders_kpi(r),
        (
            format!("{op} p50"),
            main.map_or("n/a".into(), |o| human_us(o.latency.p50_us)),
        ),
        (
            format!("{op} p99"),
            main.map_or("n/a".into(), |o| human_us(o.latency.p99_us)),
        ),
        (
            format!("{op} p99.9"),
            main.map_or("n/a".into(), |o| human_us(o.latency.p999_us)),
        ),
    ];
    h.push_str("<div>");
    for (name, value) in kpis {
        let _ = write!(
            h,
            r#"<span class="kpi"><b>{}</b>{}</span>"#,
            escape(&value),
            escape(&name)
        );
    }
    h.push_str("</div>");
}

/// Each kind of request's latency percentiles.
fn latency_table(h: &mut String, r: &BenchResult) {
    h.push_str("<h2>Latency</h2><table><tr><th>op</th><th>answers</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th><th>max</th><th>mean</th></tr>");
    for o in &r.ops {
        let l = &o.latency;
        row(
            h,
            &[
                o.op.clone(),
                l.count.to_string(),
                human_us(l.p50_us),
                human_us(l.p90_us),
                human_us(l.p99_us),
                human_us(l.p999_us),
                human_us(l.max_us),
                human_us(l.mean_us as u64),
            ],
        );
    }
    h.push_str("</table>");
}

/// The answers by status, then by error code, of each kind of request.
fn answers_tables(h: &mut String, r: &BenchResult) {
    h.push_str("<h2>Answers</h2><table><tr><th>op</th><th>status</th><th>count</th></tr>");
    for o in &r.ops {
        for (status, n) in &o.statuses {
            let status = if status == "0" {
                "no answer".to_owned()
            } else {
                status.clone()
            };
            row(h, &[o.op.clone(), status, n.to_string()]);
        }
    }
    h.push_str("</table><table><tr><th>op</th><th>error code</th><th>count</th></tr>");
    for o in &r.ops {
        for (code, n) in &o.errors {
            row(h, &[o.op.clone(), code.clone(), n.to_string()]);
        }
    }
    h.push_str("</table>");
}

/// How many attempts were sent and how they went, the orders they made, and the
/// product's inventory after the run.
fn attempts_table(h: &mut String, r: &BenchResult) {
    let a = &r.attempts;
    let o = &r.orders;
    h.push_str("<h2>Attempts and orders</h2><table>");
    for (k, v) in [
        ("elapsed", format!("{:.2} s", r.elapsed_s)),
        ("attempts sent", a.sent.to_string()),
        ("new request_ids", a.new_intents.to_string()),
        (
            "client retries (same request_id)",
            a.client_retries.to_string(),
        ),
        ("re-sends after 503 / no answer", a.retries_503.to_string()),
        ("gave up after the last re-send", a.gave_up.to_string()),
        ("dropped (in-flight cap)", a.dropped.to_string()),
        (
            "stopped early",
            a.stopped_early.clone().unwrap_or_else(|| "no".into()),
        ),
        ("orders acknowledged", o.acknowledged.to_string()),
        ("created (201)", o.created.to_string()),
        ("replays (200)", o.replayed.to_string()),
        ("paid", o.paid.to_string()),
        ("cancelled", o.cancelled.to_string()),
        ("left to expire", o.left_to_expire.to_string()),
        (
            "expiry confirmed (sample)",
            format!("{} of {}", o.expiry_confirmed, o.expiry_checked),
        ),
    ] {
        row(h, &[k.to_owned(), v]);
    }
    if let Some(i) = &r.inventory {
        row(
            h,
            &[
                "inventory total / available / reserved / sold".into(),
                format!(
                    "{} / {} / {} / {}",
                    i.total, i.available, i.reserved, i.sold
                ),
            ],
        );
    }
    h.push_str("</table>");
}

/// The cost per order (Redis calls, MariaDB commits, CPU) and the memory figures, the
/// Redis calls by command, and the note on how far the counters can be trusted.
fn costs_tables(h: &mut String, r: &BenchResult) {
    let c = &r.costs;
    h.push_str("<h2>Cost per order and memory</h2><table>");
    for (k, v) in [
        (
            "Redis script calls per order (EVAL/EVALSHA/FCALL)",
            opt_f(c.redis_script_calls_per_order),
        ),
        (
            "Redis commands per order (incl. inside scripts)",
            opt_f(c.redis_commands_per_order),
        ),
        (
            "Redis script calls / commands per attempt",
            format!(
                "{} / {}",
                opt_f(c.redis_script_calls_per_attempt),
                opt_f(c.redis_commands_per_attempt)
            ),
        ),
        (
            "MariaDB Com_commit per order",
            opt_f(c.com_commit_per_order),
        ),
        (
            "MariaDB Handler_commit per order",
            opt_f(c.handler_commit_per_order),
        ),
        (
            "Redis script calls / commands (total)",
            format!("{} / {}", opt(c.redis_script_calls), opt(c.redis_commands)),
        ),
        ("Com_commit (total)", opt(c.com_commit)),
        ("Handler_commit (total)", opt(c.handler_commit)),
    ] {
        row(h, &[k.to_owned(), v]);
    }
    memory_rows(h, &r.memory);
    for (k, per) in [
        ("CPU per attempt (/proc)", &r.cpu.us_per_attempt),
        ("CPU per order (/proc)", &r.cpu.us_per_order),
    ] {
        if !per.is_empty() {
            row(h, &[k.to_owned(), crate::report::cpu_line(per)]);
        }
    }
    h.push_str("</table>");
    if !c.redis_commands_by_command.is_empty() {
        h.push_str("<table><tr><th>Redis command</th><th>calls (incl. inside scripts)</th></tr>");
        for (cmd, n) in &c.redis_commands_by_command {
            row(h, &[cmd.clone(), n.to_string()]);
        }
        h.push_str("</table>");
    }
    let _ = write!(h, "<p><small>{}</small></p>", escape(&c.note));
}

/// The memory rows of the cost table: the server's, Redis's, and the keys'.
fn memory_rows(h: &mut String, m: &crate::report::Memory) {
    for (k, v) in [
        ("server peak RSS (VmHWM, kB)", opt(m.server_vm_hwm_kb)),
        ("server RSS at the end (kB)", opt(m.server_vm_rss_kb)),
        (
            "Redis used_memory before / after / settled",
            format!(
                "{} / {} / {}",
                opt(m.redis_used_memory_before),
                opt(m.redis_used_memory_after),
                opt(m.redis_used_memory_settled)
            ),
        ),
        (
            "Redis bytes per order",
            m.redis_bytes_per_order
                .map_or("n/a".into(), |b| format!("{b:.0}")),
        ),
        (
            "keys under the prefix before / after / settled",
            format!(
                "{} / {} / {}",
                opt(m.keys_before),
                opt(m.keys_after),
                opt(m.keys_settled)
            ),
        ),
    ] {
        row(h, &[k.to_owned(), v]);
    }
}

/// A run's checks as list items: those passed, those skipped, those failed.
fn check_items(h: &mut String, checks: &crate::report::Checks) {
    for line in &checks.client_passed {
        let _ = write!(h, "<li>ok: {}</li>", escape(line));
    }
    for line in &checks.skipped {
        let _ = write!(h, "<li>skipped: {}</li>", escape(line));
    }
    for line in &checks.client_violations {
        let _ = write!(h, "<li><b>FAILED: {}</b></li>", escape(line));
    }
}

/// The page's end: the configuration it was made with, as JSON.
fn page_end(h: &mut String, config: &impl serde::Serialize) {
    let config = serde_json::to_string_pretty(config).unwrap_or_default();
    let _ = writeln!(
        h,
        "<h2>Configuration</h2><pre>{}</pre></body></html>",
        escape(&config)
    );
}

/// The servers the load was spread over: each one's attempts, how they ended (the last
/// exchange's status; "no answer" is an unknown outcome), and every exchange's error
/// codes — the text summary's table with the detail it leaves out.
fn targets_table(h: &mut String, r: &BenchResult) {
    h.push_str("<h2>Servers</h2><table><tr><th>base URL</th><th>attempts</th><th>last answer of each attempt</th><th>error codes (every exchange)</th><th>exchanges without an answer</th></tr>");
    for t in &r.targets {
        let outcomes: Vec<String> = t
            .outcomes
            .iter()
            .map(|(s, n)| {
                let s = if s == "0" { "no answer" } else { s.as_str() };
                format!("{s}: {n}")
            })
            .collect();
        let errors: Vec<String> = t.errors.iter().map(|(e, n)| format!("{e}: {n}")).collect();
        row(
            h,
            &[
                t.base_url.clone(),
                t.attempts.to_string(),
                outcomes.join(", "),
                errors.join(", "),
                t.statuses.get("0").copied().unwrap_or(0).to_string(),
            ],
        );
    }
    h.push_str("</table>");
}

/// The runs' names in a comparison: their labels, the second ceiling run's apart.
fn run_names(runs: &[&BenchResult]) -> Vec<String> {
    let mut ceilings = 0;
    runs.iter()
        .map(|r| {
            if r.is_ceiling() {
                ceilings += 1;
                if ceilings > 1 {
                    return crate::cli::CEILING_AGAIN_LABEL.to_owned();
                }
            }
            r.label()
        })
        .collect()
}

/// The ceilings (GET and POST) are drawn dashed: yardsticks, not strategies.
fn is_a_ceiling(r: &BenchResult) -> bool {
    r.is_ceiling() || r.config.strategy.as_deref() == Some(Strategy::HTTP_POST_CEILING.name())
}

/// One series per run of a comparison, each in a colour of its own and a ceiling's
/// dashed: `draw` gives a run's series name (from the run's name) and points, or None to
/// leave the run out.
fn run_series(
    report: &CompareReport,
    draw: impl Fn(&BenchResult, String) -> Option<(String, Vec<(f64, f64)>)>,
) -> Vec<Series> {
    let runs = report.chart_runs();
    runs.iter()
        .zip(run_names(&runs))
        .zip(RUN_COLORS.iter().cycle())
        .filter_map(|((r, name), color)| {
            let (name, points) = draw(r, name)?;
            Some(Series {
                name,
                color,
                dashed: is_a_ceiling(r),
                points,
            })
        })
        .collect()
}

/// Each run's latency percentile curve (of its main requests: purchases, healthz for
/// the ceiling) on one chart.
pub fn compare_latency_chart(report: &CompareReport) -> Chart {
    let series = run_series(report, |r, name| {
        let o = r.main_op().filter(|o| o.latency.count > 0)?;
        let name = format!("{name} (max {})", human_us(o.latency.max_us));
        Some((name, curve_points(&o.curve)))
    });
    latency_axes("Latency by strategy (percentile curve, log scale)", series)
}

/// Each run's answers per second over time on one chart.
pub fn compare_throughput_chart(report: &CompareReport) -> Chart {
    let series = run_series(report, |r, name| {
        let points = r
            .timeline
            .iter()
            .map(|b| {
                let all = b.ok + b.rejected + b.unavailable + b.transport_errors;
                rate_point(b, r.timeline_step_ms, all, r.elapsed_s)
            })
            .collect();
        Some((name, points))
    });
    Chart {
        title: "Answers per second over time, by strategy".into(),
        x_label: "seconds since the start of each run's load".into(),
        y_label: "answers per second".into(),
        x_scale: Scale::Linear,
        y_scale: Scale::Linear,
        x_ticks: Vec::new(),
        y_format: count_format,
        series,
    }
}

/// The comparison's table of `rows`: headers wrapped and figures set small, so that its
/// ratio columns fit the page's width (`.compare`, widened on the comparison's page);
/// scrolling sideways only on a narrow screen.
fn compare_table(h: &mut String, rows: &[compare::CompareRow]) {
    h.push_str(r#"<div style="overflow-x: auto"><table class="compare"><tr>"#);
    for head in compare::headers() {
        let _ = write!(h, "<th>{}</th>", escape(&head));
    }
    h.push_str("</tr>");
    for row in rows {
        self::row(h, &compare::cells(row));
    }
    h.push_str("</table></div>");
}

/// The comparison's page: the table (of medians, over several rounds, followed by each
/// round's), the notes, the latency and throughput of every run on shared charts (of the
/// median round, over several), and each run's checks.
pub fn compare_report(report: &CompareReport) -> String {
    let mut h = String::new();
    let m = &report.meta;
    let title = format!(
        "flashsale-bench compare — {}{}",
        m.scenario,
        if m.quick { " (quick)" } else { "" },
    );
    page_start(&mut h, &title, &m.started_at);
    // The comparison's table has a dozen figures a row: the page is wider than a run's.
    h.push_str("<style>body { max-width: 1280px; }</style>");
    let _ = write!(
        h,
        r#"<p class="verdict {}">{}</p>"#,
        if report.passed { "pass" } else { "fail" },
        if report.passed {
            "PASS — no invariant violation in the flashsale run (baselines reported, not judged)"
        } else {
            "FAIL — the flashsale run has invariant violations, see the notes"
        }
    );
    let _ = write!(
        h,
        "<p>{} — {} attempts, stock {}, {} users, seed {}; each run on its own freshly spawned server.</p>",
        escape(&m.load),
        m.attempts_max,
        m.stock,
        m.users,
        m.seed
    );
    if !report.rounds.is_empty() {
        let _ = write!(h, "<p>Medians over {} rounds:</p>", report.rounds.len());
    }
    compare_table(&mut h, &report.rows);
    h.push_str("<ul>");
    for note in &report.notes {
        let _ = write!(h, "<li>{}</li>", escape(note));
    }
    h.push_str("</ul>");
    for (i, round) in report.rounds.iter().enumerate() {
        let _ = write!(h, "<h3>Round {} of {}</h3>", i + 1, report.rounds.len());
        compare_table(&mut h, &round.rows);
    }
    if !report.runs.is_empty() {
        let _ = write!(
            h,
            "<figure>{}</figure><figure>{}</figure>",
            render_chart(&compare_latency_chart(report)),
            render_chart(&compare_throughput_chart(report))
        );
    }
    h.push_str("<h2>Each run's checks</h2>");
    for (i, r) in report.runs.iter().enumerate() {
        let round = report
            .rounds
            .iter()
            .position(|round| round.runs.contains(&i))
            .map_or_else(String::new, |k| format!(" (round {})", k + 1));
        let _ = write!(
            h,
            "<h3>{}{round}</h3><p>{} — audit {}</p><ul>",
            escape(&r.label()),
            if r.passed { "pass" } else { "FAIL" },
            escape(&r.checks.audit.status)
        );
        check_items(&mut h, &r.checks);
        h.push_str("</ul>");
    }
    page_end(&mut h, &report.meta);
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{ceiling_sample, sample};
    use clap::Parser as _;

    fn svgs(html: &str) -> Vec<&str> {
        let mut out = Vec::new();
        let mut rest = html;
        while let Some(start) = rest.find("<svg") {
            let end = rest[start..].find("</svg>").expect("closed svg") + start + 6;
            out.push(&rest[start..end]);
            rest = &rest[end..];
        }
        out
    }

    // Checks the legend's layout: a few short names stay on one row; the seven runs of a
    // comparison with their "(max …)" wrap onto more rows, no entry's name runs past the
    // chart's right edge, and the rendered chart grows by as many rows (its plot moved
    // down, its legend rows below each other).
    #[test]
    fn legend_wraps_at_the_right_edge() {
        assert!(legend_layout(&["2xx", "4xx", "5xx"])
            .iter()
            .all(|&(_, row)| row == 0));
        let names = [
            "http-ceiling (max 12.82ms)",
            "http-post-ceiling (max 8.86ms)",
            "db-pessimistic (max 48.67ms)",
            "db-conditional (max 40.01ms)",
            "redis-lua (max 27.30ms)",
            "flashsale (max 13.11ms)",
            "http-ceiling-again (max 9.75ms)",
        ];
        let layout = legend_layout(&names);
        let rows = layout.iter().map(|&(_, row)| row).max().unwrap_or(0);
        assert!(rows >= 1, "{layout:?}");
        for (name, &(x, _)) in names.iter().zip(&layout) {
            assert!(
                x + 16.0 + 7.2 * name.chars().count() as f64 <= WIDTH,
                "{name}: {x}"
            );
        }
        let chart = Chart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            x_ticks: Vec::new(),
            y_format: number,
            series: names
                .iter()
                .map(|n| Series {
                    name: (*n).to_owned(),
                    color: "#000000",
                    dashed: false,
                    points: vec![(0.0, 1.0), (1.0, 2.0)],
                })
                .collect(),
        };
        let svg = render_chart(&chart);
        let grown = HEIGHT + rows as f64 * LEGEND_ROW;
        assert!(svg.contains(&format!(r#"height="{grown}""#)), "{svg}");
        let doc = roxmltree::Document::parse(&svg).expect("valid SVG");
        let legend_ys: std::collections::BTreeSet<String> = doc
            .descendants()
            .filter(|n| n.has_tag_name("rect") && n.attribute("width") == Some("12"))
            .filter_map(|n| n.attribute("y").map(str::to_owned))
            .collect();
        assert_eq!(legend_ys.len(), rows + 1, "{legend_ys:?}");
    }

    // Checks a step's point is a rate: a whole step as counted, a run's partial last step
    // (or a run shorter than a step, however short) divided by the part covered and drawn
    // at its middle, and a last sliver under a tenth of a step counted as a tenth; with
    // one-second and 100 ms steps.
    #[test]
    fn buckets_are_drawn_as_rates() {
        let at = |start_ms| crate::stats::Bucket {
            start_ms,
            ..Default::default()
        };
        assert_eq!(rate_point(&at(0), 1_000, 5_000, 3.5), (0.5, 5_000.0));
        assert_eq!(rate_point(&at(3_000), 1_000, 2_500, 3.5), (3.25, 5_000.0));
        assert_eq!(rate_point(&at(0), 1_000, 4_000, 0.25), (0.125, 16_000.0));
        assert_eq!(rate_point(&at(0), 1_000, 4_000, 0.05), (0.025, 80_000.0));
        let (x, y) = rate_point(&at(2_000), 1_000, 30, 2.01);
        assert!(
            (x - 2.05).abs() < 1e-9 && (y - 300.0).abs() < 1e-6,
            "{x} {y}"
        );
        let (x, y) = rate_point(&at(300), 100, 50, 2.0);
        assert!(
            (x - 0.35).abs() < 1e-9 && (y - 500.0).abs() < 1e-6,
            "{x} {y}"
        );
        let (x, y) = rate_point(&at(1_900), 100, 5, 1.901);
        assert!(
            (x - 1.905).abs() < 1e-9 && (y - 500.0).abs() < 1e-6,
            "{x} {y}"
        );
    }

    fn series_names(doc: &roxmltree::Document) -> Vec<String> {
        doc.descendants()
            .filter(|n| n.attribute("class") == Some("series"))
            .filter_map(|n| n.attribute("data-name").map(str::to_owned))
            .collect()
    }

    // Checks the throughput plot is well-formed SVG (parsed by an XML parser) and holds
    // one polyline per expected series: all answers, 2xx, 4xx, orders always; 5xx and
    // dropped because the sample has some; "no answer" left out because the sample has
    // none.
    #[test]
    fn throughput_svg_is_well_formed_with_the_expected_series() {
        let svg = render_chart(&throughput_chart(&sample()));
        let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let names = series_names(&doc);
        assert_eq!(
            names,
            [
                "all answers",
                "2xx",
                "4xx rejected",
                "orders (201)",
                "5xx",
                "dropped"
            ],
        );
        let polylines = doc
            .descendants()
            .filter(|n| n.has_tag_name("polyline"))
            .count();
        assert_eq!(polylines, names.len());
        // Two buckets: each series has two points.
        let first = doc
            .descendants()
            .find(|n| n.has_tag_name("polyline"))
            .and_then(|n| n.attribute("points"))
            .expect("points");
        assert_eq!(first.split(' ').count(), 2, "{first}");
    }

    // Checks the latency plot: well-formed, one series per op with answers, on a log
    // y axis (decade ticks 100µs, 1ms, 10ms, 100ms around the sample's 100µs..12ms), and
    // the percentile labels of the nines axis with the max at the end.
    #[test]
    fn latency_svg_has_log_axis_and_percentile_labels() {
        let svg = render_chart(&latency_chart(&sample()));
        let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
        assert_eq!(series_names(&doc), ["purchase (max 12.00ms)"]);
        let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
        for label in ["100µs", "1ms", "10ms", "100ms", "90%", "99.9%", "max"] {
            assert!(texts.contains(&label), "missing {label}: {texts:?}");
        }
    }

    // Checks text is escaped: a series name with XML metacharacters still gives a
    // well-formed SVG whose text reads back unchanged.
    #[test]
    fn names_are_escaped() {
        let chart = Chart {
            title: "a <b> & \"c\"".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            x_ticks: Vec::new(),
            y_format: count_format,
            series: vec![Series {
                name: "<script>&".into(),
                color: "#000",
                dashed: true,
                points: vec![(1.0, 2.0)],
            }],
        };
        let svg = render_chart(&chart);
        let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
        assert_eq!(series_names(&doc), ["<script>&"]);
        assert!(!svg.contains("<script>"));
    }

    // Checks the whole report: every inline SVG in it parses (throughput, latency and
    // memory, since the sample has RSS figures), and the verdict and tables are there.
    #[test]
    fn report_embeds_parsable_plots() {
        let html = report(&sample());
        let found = svgs(&html);
        assert_eq!(found.len(), 3);
        for svg in found {
            roxmltree::Document::parse(svg).expect("well-formed SVG");
        }
        assert!(html.contains("PASS"));
        assert!(html.contains("sold_out"));
        assert!(html.contains("Redis script calls per order"));
        assert!(!html.contains("<h2>Servers</h2>"), "one server: no table");
    }

    // Checks the per-server table of the page, by rendering the sample with a second
    // target that lost attempts: a "Servers" section with a row per base URL, its last
    // answers ("no answer" spelled out) and its exchanges without an answer.
    #[test]
    fn report_lists_each_server() {
        let mut r = sample();
        let mut second = r.targets[0].clone();
        second.base_url = "http://127.0.0.1:5678".into();
        second.outcomes = [("0".into(), 7), ("201".into(), 3)].into();
        second.statuses = [("0".into(), 28), ("201".into(), 3)].into();
        r.targets.push(second);
        let html = report(&r);
        assert!(html.contains("<h2>Servers</h2>"), "{html}");
        assert!(html.contains("<td>http://127.0.0.1:5678</td>"));
        assert!(html.contains("<td>no answer: 7, 201: 3</td>"), "{html}");
        assert!(html.contains("<td>28</td>"));
    }

    // Checks the comparison page: a ceiling and a flashsale run give a page whose two
    // shared charts parse as SVG with one series per run (the latency chart names the
    // ceiling and flashsale), and whose table holds the comparison's headers and rows.
    #[test]
    fn compare_page_embeds_parsable_shared_plots() {
        let ceiling = ceiling_sample();
        let report = crate::compare::build(
            crate::compare::Meta {
                scenario: "rush".into(),
                started_at: "2026-11-29T10:00:00Z".into(),
                seed: 1,
                load: "closed loop, 64 connections".into(),
                attempts_max: 3000,
                stock: 600,
                users: 1000,
                quick: true,
                rounds: 1,
            },
            vec![
                crate::compare::RunOutcome {
                    spec: crate::cli::Args::try_parse_from(["b", "rush", "--ceiling"])
                        .expect("args")
                        .runs()
                        .expect("runs")
                        .remove(0),
                    result: Ok(ceiling),
                },
                crate::compare::RunOutcome {
                    spec: crate::cli::Args::try_parse_from(["b", "rush"])
                        .expect("args")
                        .runs()
                        .expect("runs")
                        .remove(0),
                    result: Ok(sample()),
                },
            ],
        );
        let html = compare_report(&report);
        let found = svgs(&html);
        assert_eq!(found.len(), 2);
        for svg in &found {
            let doc = roxmltree::Document::parse(svg).expect("well-formed SVG");
            assert_eq!(series_names(&doc).len(), 2);
        }
        let latency = roxmltree::Document::parse(found[0]).expect("svg");
        assert_eq!(
            series_names(&latency),
            ["http-ceiling (max 12.00ms)", "flashsale (max 12.00ms)"]
        );
        for needle in [
            "<th>attempts/s</th>",
            "<td>http-ceiling</td>",
            "PASS",
            // The table is set to fit the page: small figures, wrapped headers, a wider
            // page than a run's.
            r#"<table class="compare">"#,
            "body { max-width: 1280px; }",
        ] {
            assert!(html.contains(needle), "missing {needle}");
        }
    }

    // Checks the axis helpers: linear ticks are 1/2/5 steps from 0 past the maximum;
    // log ticks are the decades around the data; nines() maps 90/99/99.9 to 1/2/3.
    #[test]
    fn axis_helpers() {
        assert_eq!(linear_ticks(9.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(
            linear_ticks(4800.0),
            vec![0.0, 1000.0, 2000.0, 3000.0, 4000.0, 5000.0]
        );
        assert_eq!(
            log_ticks(150.0, 12_000.0),
            vec![100.0, 1000.0, 10_000.0, 100_000.0]
        );
        for (p, n) in [(90.0, 1.0), (99.0, 2.0), (99.9, 3.0), (0.0, 0.0)] {
            assert!((nines(p) - n).abs() < 1e-9, "{p}");
        }
    }
}
