//! Seed 002's experiment: the same trace, seed by seed, without
//! reallocation and with each (algorithm, heuristic) pair, compared job by
//! job: how many of gleaner's jobs a reallocation touches (their
//! completion changes), how often they move, how many complete early, and
//! their average response time against the run without reallocation.

use std::{collections::BTreeMap, path::Path, time::Duration};

use gleaner_policy::reallocation::{Algorithm, Heuristic};
use plotters::prelude::*;
use serde_json::json;

use crate::{GridOutcome, Scenario, simulate};

/// The pairs the seed compares.
pub const PAIRS: [(Algorithm, Heuristic); 4] = [
    (Algorithm::Regular, Heuristic::Mct),
    (Algorithm::Regular, Heuristic::Minmin),
    (Algorithm::AllCancellation, Heuristic::Mct),
    (Algorithm::AllCancellation, Heuristic::Minmin),
];

/// One pair's figures on one seed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Figures {
    /// gleaner's jobs done in both runs.
    pub jobs: usize,
    /// Of them, the share whose completion changed.
    pub impacted: f64,
    /// Moves per job.
    pub reallocations: f64,
    /// Of the impacted, the share that completed earlier.
    pub early: f64,
    /// Mean response time of the impacted, against the run without.
    pub relative_response: f64,
}

/// Every pair's figures, seed by seed.
#[derive(Debug, Clone)]
pub struct Study {
    pub scenario: String,
    pub seeds: u64,
    pub pairs: Vec<((Algorithm, Heuristic), Vec<Figures>)>,
}

/// When a job completed (s into the run), by job.
fn completions(jobs: &[GridOutcome]) -> BTreeMap<usize, (f64, f64, u32)> {
    jobs.iter()
        .enumerate()
        .filter(|(_, j)| j.done)
        .filter_map(|(i, j)| Some((i, (j.arrival, j.arrival + j.makespan_s?, j.moves))))
        .collect()
}

/// A job done in both runs: its arrival, its completion without and with
/// reallocation, and its moves.
type Compared = (f64, f64, f64, u32);

/// A pair's run against the run without reallocation.
pub fn compare(without: &[GridOutcome], with: &[GridOutcome]) -> Figures {
    let (base, run) = (completions(without), completions(with));
    let both: Vec<Compared> = base
        .iter()
        .filter_map(|(i, (arrival, end, _))| {
            let (_, end2, moves) = run.get(i)?;
            Some((*arrival, *end, *end2, *moves))
        })
        .collect();
    if both.is_empty() {
        return Figures::default();
    }
    let impacted: Vec<&Compared> = both
        .iter()
        .filter(|(_, end, end2, _)| (end - end2).abs() > 1.0)
        .collect();
    let early = impacted
        .iter()
        .filter(|(_, end, end2, _)| end2 < end)
        .count();
    let mean = |f: &dyn Fn(&Compared) -> f64| {
        impacted.iter().map(|j| f(j)).sum::<f64>() / impacted.len().max(1) as f64
    };
    let before = mean(&|(arrival, end, _, _)| end - arrival);
    let after = mean(&|(arrival, _, end2, _)| end2 - arrival);
    let moves: u32 = both.iter().map(|(_, _, _, m)| m).sum();
    Figures {
        jobs: both.len(),
        impacted: impacted.len() as f64 / both.len() as f64,
        reallocations: f64::from(moves) / both.len() as f64,
        early: early as f64 / impacted.len().max(1) as f64,
        relative_response: match before > 0.0 {
            true => after / before,
            false => 1.0,
        },
    }
}

impl Study {
    /// Runs `scenario` on seeds 1..=`seeds`: without reallocation, and
    /// with each pair every `reallocate_every` of its scheduler settings
    /// (seed 002: an hour).
    pub fn run(scenario: &Scenario, seeds: u64) -> Self {
        let mut every = scenario.scheduler.grid.reallocate_every;
        if every.is_zero() {
            every = Duration::from_secs(3600);
        }
        let mut pairs: Vec<((Algorithm, Heuristic), Vec<Figures>)> =
            PAIRS.iter().map(|p| (*p, Vec::new())).collect();
        for seed in 1..=seeds {
            let mut base = scenario.clone();
            base.seed = seed;
            base.scheduler.grid.reallocate_every = Duration::ZERO;
            let without = simulate(&base, None).grid_jobs;
            for ((algorithm, heuristic), figures) in &mut pairs {
                let mut with = base.clone();
                with.scheduler.grid.reallocate_every = every;
                with.scheduler.grid.reallocation = *algorithm;
                with.scheduler.grid.reallocation_heuristic = *heuristic;
                figures.push(compare(&without, &simulate(&with, None).grid_jobs));
            }
        }
        Self {
            scenario: scenario.name.clone(),
            seeds,
            pairs,
        }
    }

    pub fn text(&self) -> String {
        let mut out = format!(
            "\n  seed 002's reallocation over {} seeds (means; response time of the jobs whose completion changed, against no reallocation)\n  {:<30} {:>6} {:>10} {:>15} {:>8} {:>18}\n",
            self.seeds,
            "algorithm, heuristic",
            "jobs",
            "impacted",
            "reallocations",
            "early",
            "response time"
        );
        for ((algorithm, heuristic), figures) in &self.pairs {
            let mean = |f: fn(&Figures) -> f64| {
                figures.iter().map(f).sum::<f64>() / figures.len().max(1) as f64
            };
            out.push_str(&format!(
                "  {:<30} {:>6.0} {:>9.1} % {:>11.2}/job {:>6.1} % {:>15.1} %\n",
                format!("{}, {}", name(*algorithm), heuristic_name(*heuristic)),
                mean(|f| f.jobs as f64),
                mean(|f| f.impacted) * 100.0,
                mean(|f| f.reallocations),
                mean(|f| f.early) * 100.0,
                (mean(|f| f.relative_response) - 1.0) * 100.0,
            ));
        }
        out
    }

    pub fn json(&self) -> serde_json::Value {
        let pairs: Vec<_> = self
            .pairs
            .iter()
            .map(|((a, h), figures)| {
                json!({
                    "algorithm": name(*a),
                    "heuristic": heuristic_name(*h),
                    "seeds": figures.iter().map(|f| json!({
                        "jobs": f.jobs, "impacted": f.impacted, "reallocations_per_job": f.reallocations,
                        "early": f.early, "relative_response_time": f.relative_response,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({ "scenario": self.scenario, "seeds": self.seeds, "pairs": pairs })
    }

    /// Box plots of each pair's relative response time over the seeds,
    /// as a PNG.
    pub fn box_plot(&self, path: &Path) -> Result<(), String> {
        let fail = |e: String| format!("{}: {e}", path.display());
        crate::plot::register_font()?;
        let root = BitMapBackend::new(path, (900, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
        let values: Vec<Vec<f64>> = self
            .pairs
            .iter()
            .map(|(_, f)| f.iter().map(|f| f.relative_response).collect())
            .collect();
        let (low, high) = values
            .iter()
            .flatten()
            .fold((1.0f64, 1.0f64), |(l, h), v| (l.min(*v), h.max(*v)));
        let labels: Vec<String> = self
            .pairs
            .iter()
            .map(|((a, h), _)| format!("{}, {}", name(*a), heuristic_name(*h)))
            .collect();
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "{}: response time with reallocation / without",
                    self.scenario
                ),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .build_cartesian_2d(
                labels.as_slice().into_segmented(),
                (low - 0.05) as f32..(high + 0.05) as f32,
            )
            .map_err(|e| fail(e.to_string()))?;
        chart
            .configure_mesh()
            .y_desc("relative response time")
            .draw()
            .map_err(|e| fail(e.to_string()))?;
        chart
            .draw_series(labels.iter().zip(&values).map(|(label, v)| {
                let quartiles = Quartiles::new(v);
                Boxplot::new_vertical(SegmentValue::CenterOf(label), &quartiles)
            }))
            .map_err(|e| fail(e.to_string()))?;
        root.present().map_err(|e| fail(e.to_string()))
    }
}

fn name(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Regular => "regular",
        Algorithm::AllCancellation => "all-cancellation",
    }
}

fn heuristic_name(heuristic: Heuristic) -> &'static str {
    match heuristic {
        Heuristic::Mct => "mct",
        Heuristic::Minmin => "minmin",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gleaner_manifest::Priority;

    fn outcome(arrival: f64, makespan: f64, moves: u32) -> GridOutcome {
        GridOutcome {
            size: 4,
            components: 1,
            priority: Priority::Low,
            placement_s: None,
            start_delay_s: None,
            coallocated: false,
            claiming_tries: 0,
            restarts: 0,
            preemptions: 0,
            done: true,
            makespan_s: Some(makespan),
            moves,
            arrival,
        }
    }

    #[test]
    fn figures_compare_jobs_one_by_one() {
        let without = [
            outcome(0.0, 100.0, 0),
            outcome(10.0, 200.0, 0),
            outcome(20.0, 50.0, 0),
        ];
        // The first completes 50 s earlier, the second 20 s later.
        let with = [
            outcome(0.0, 50.0, 1),
            outcome(10.0, 220.0, 1),
            outcome(20.0, 50.0, 0),
        ];
        let f = compare(&without, &with);
        assert_eq!(f.jobs, 3);
        assert!((f.impacted - 2.0 / 3.0).abs() < 1e-9);
        assert!((f.reallocations - 2.0 / 3.0).abs() < 1e-9);
        assert!((f.early - 0.5).abs() < 1e-9);
        assert!((f.relative_response - 270.0 / 300.0).abs() < 1e-9);
    }
}
