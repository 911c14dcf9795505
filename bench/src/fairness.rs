//! The simulator on seed 000's fairness experiments (section 4.4): the
//! thesis's rows (Tables 4.4 and 4.5), KOALA-CS's own choices simulated
//! (`koala-*.toml`) and gleaner's (`das3-*.toml`), in one table.

use std::path::Path;

use gleaner_simulator::{Comparison, Run, Scenario, spread};

/// Seed 000's measured rows per workload: (policy, throughputs, launcher
/// time-outs, preemptions) of its three runners.
type SeedRow = (&'static str, [f64; 3], [u32; 3], [u32; 3]);

#[rustfmt::skip]
const SEED: [(&str, [SeedRow; 2]); 3] = [
    (
        "free",
        [
            ("SEP", [0.0413, 0.0405, 0.0449], [85, 46, 40], [636, 658, 653]),
            ("GEP", [0.0858, 0.0366, 0.0258], [167, 87, 16], [119, 507, 588]),
        ],
    ),
    (
        "block",
        [
            ("SEP", [0.0435, 0.0399, 0.0471], [36, 47, 37], [323, 321, 333]),
            ("GEP", [0.0280, 0.0546, 0.0322], [42, 4, 103], [346, 304, 333]),
        ],
    ),
    (
        "spike",
        [
            ("SEP", [0.0427, 0.0391, 0.0360], [33, 39, 47], [568, 564, 565]),
            ("GEP", [0.0438, 0.0336, 0.0644], [50, 147, 109], [525, 470, 309]),
        ],
    ),
];

fn joined<T: ToString>(values: impl IntoIterator<Item = T>) -> String {
    values
        .into_iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(" / ")
}

/// Largest throughput difference, relative to the slowest.
fn seed_spread(throughputs: &[f64; 3]) -> f64 {
    let min = throughputs.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = throughputs.iter().cloned().fold(0.0, f64::max);
    (max - min) / min
}

fn row(workload: &str, who: &str, comparison: &Comparison, run: &Run) {
    let local = comparison.local_delay(run);
    let grid = comparison.grid_delay(run);
    println!(
        "| {workload} | {who}, {} | {} | {} | {} | **{:.1} %** | {:.1} / {:.1} | {} |",
        run.policy.map_or("none", |p| p.name()),
        joined(run.jobs.iter().map(|j| format!("{:.4}", j.throughput))),
        joined(run.jobs.iter().map(|j| j.timeouts)),
        joined(run.jobs.iter().map(|j| j.preemptions)),
        spread(run) * 100.0,
        local.mean,
        local.max,
        if grid.jobs == 0 {
            "–".to_owned()
        } else {
            format!("{:.1} / {:.1}", grid.mean, grid.max)
        },
    );
}

fn comparison(dir: &Path, name: &str) -> anyhow::Result<Comparison> {
    let path = dir.join(format!("{name}.toml"));
    let text = std::fs::read_to_string(&path)?;
    let scenario =
        Scenario::from_toml(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(Comparison::run(&scenario, None))
}

pub fn scenarios(dir: &Path) -> anyhow::Result<()> {
    for (workload, seed_rows) in SEED {
        for (policy, throughputs, timeouts, preemptions) in seed_rows {
            println!(
                "| {workload} | seed 000 on DAS-3, {policy} | {} | {} | {} | **{:.1} %** | – | – |",
                joined(throughputs.iter().map(|t| format!("{t:.4}"))),
                joined(timeouts),
                joined(preemptions),
                seed_spread(&throughputs) * 100.0,
            );
        }
        let koala = comparison(dir, &format!("koala-{workload}"))?;
        for run in &koala.runs {
            row(workload, "KOALA-CS simulated", &koala, run);
        }
        for name in [
            format!("das3-{workload}"),
            format!("das3-{workload}-no-drain"),
        ] {
            if !dir.join(format!("{name}.toml")).exists() {
                continue;
            }
            let gleaner = comparison(dir, &name)?;
            let who = if name.ends_with("no-drain") {
                "gleaner, no drains"
            } else {
                "gleaner"
            };
            for run in &gleaner.runs {
                row(workload, who, &gleaner, run);
            }
        }
    }
    Ok(())
}
