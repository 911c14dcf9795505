//! The grid's load over time, stacked like seed 000's Figure 4.2: local jobs
//! at the bottom, grid jobs on them, scavenging on top.

use std::path::Path;

use plotters::prelude::*;

use crate::model::Run;

/// A stacked area: its legend, its colour, its top edge.
type Layer = (&'static str, RGBColor, Vec<(f64, f64)>);

/// The load plot of one run, as a PNG at `path`.
pub fn load(run: &Run, title: &str, path: &Path) -> Result<(), String> {
    let fail = |e: String| format!("{}: {e}", path.display());
    register_font()?;
    let root = BitMapBackend::new(path, (900, 360)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let minutes = run.samples.last().map_or(1.0, |s| s.at / 60.0);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(45)
        .build_cartesian_2d(0.0..minutes, 0.0..1.0)
        .map_err(|e| fail(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("time (minutes)")
        .y_desc("load")
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    let total = f64::from(run.total_nodes.max(1));
    let layer = |f: &dyn Fn(&crate::model::Sample) -> u32| -> Vec<(f64, f64)> {
        run.samples
            .iter()
            .map(|s| (s.at / 60.0, f64::from(f(s)) / total))
            .collect()
    };
    let layers: [Layer; 3] = [
        (
            "scavenging",
            RGBColor(240, 140, 40),
            layer(&|s| s.local + s.grid + s.scavenged),
        ),
        (
            "grid jobs",
            RGBColor(60, 110, 200),
            layer(&|s| s.local + s.grid),
        ),
        ("local jobs", RGBColor(80, 170, 80), layer(&|s| s.local)),
    ];
    for (label, color, points) in layers {
        chart
            .draw_series(AreaSeries::new(points, 0.0, color.mix(0.85)))
            .map_err(|e| fail(e.to_string()))?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    root.present().map_err(|e| fail(e.to_string()))
}

/// A line of a [`lines`] chart: its legend and its points.
pub type Line = (String, Vec<(f64, f64)>);

/// Measured series against one axis (a benchmark's figure), as a PNG at
/// `path`, with a mark at every measured point.
pub fn lines(title: &str, axes: (&str, &str), series: &[Line], path: &Path) -> Result<(), String> {
    let fail = |e: String| format!("{}: {e}", path.display());
    register_font()?;
    let points = series.iter().flat_map(|(_, points)| points);
    let x_max = points.clone().map(|p| p.0).fold(1.0, f64::max);
    let y_max = points.map(|p| p.1).fold(1.0, f64::max);
    let root = BitMapBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..x_max * 1.05, 0.0..y_max * 1.1)
        .map_err(|e| fail(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc(axes.0)
        .y_desc(axes.1)
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    for (i, (label, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| fail(e.to_string()))?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], color.stroke_width(2)));
        chart
            .draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(|e| fail(e.to_string()))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    root.present().map_err(|e| fail(e.to_string()))
}

/// Where a plot's letters come from: the first of these fonts found
/// (Debian's `fonts-dejavu-core`), registered once for the process.
const FONTS: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

pub fn register_font() -> Result<(), String> {
    static REGISTERED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let bytes = FONTS
                .iter()
                .find_map(|path| std::fs::read(path).ok())
                .ok_or_else(|| format!("no font for the plot's text ({})", FONTS.join(", ")))?;
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes.leak())
                .map_err(|_| "the font for the plot's text is not a font".to_owned())
        })
        .clone()
}
