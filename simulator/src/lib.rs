//! gleaner's scheduling on a simulated grid.
//!
//! The services' own cores run here on a simulated clock, driven with the
//! loop their shells drive them with (events in, `poll_effect` until there
//! is none, answers handed back at once): the scheduler's
//! [`gleaner_scheduler_core::core::SchedulerCore`] (a round at the simulation's
//! interval and whenever the core hurries one), one kcm core
//! ([`gleaner_kcm_core::core::KcmCore`]) per cluster, whose commands act on the
//! simulated batch system, and the runner's own machine
//! ([`gleaner_runner_core::JobMachine`] around [`gleaner_runner_core::Sweep`]) per
//! scavenging job, which publishes its tasks to a simulated task queue, and
//! the launcher's own core ([`gleaner_launcher_core::core::LauncherCore`])
//! in each placeholder, which takes them from it. Time goes from one
//! wake-up to the next, whoever's it is: a core's timer or an event of a
//! batch system. The batch systems and what runs in them are simulated
//! and decide nothing for gleaner. A scenario runs once without scavenging jobs (the baseline) and
//! once per policy, with the same background load, so that the delay
//! scavenging adds to local and grid jobs is measured job by job.

mod batch;
mod launcher;
mod model;
pub mod plot;
mod runner;
mod scenario;
pub mod study;
pub mod workload;

use std::{collections::BTreeMap, path::Path};

use gleaner_policy::share::CsPolicy;
use serde_json::json;

pub use model::{GridOutcome, JobResult, Run, Sample, simulate};
pub use scenario::{Scenario, ScenarioError};

/// A scenario under each of its policies, against its baseline.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub scenario: String,
    pub baseline: Run,
    pub runs: Vec<Run>,
    /// Seed 002's reallocation experiment, where the scenario asks for it.
    pub study: Option<study::Study>,
}

/// How much a run's waits exceed the baseline's, over the jobs that started in both.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AddedDelay {
    pub jobs: usize,
    pub mean: f64,
    pub max: f64,
}

impl AddedDelay {
    fn between<K: Ord>(run: &BTreeMap<K, f64>, baseline: &BTreeMap<K, f64>) -> Self {
        let added: Vec<f64> = run
            .iter()
            .filter_map(|(id, wait)| baseline.get(id).map(|base| wait - base))
            .collect();
        if added.is_empty() {
            return Self::default();
        }
        Self {
            jobs: added.len(),
            mean: added.iter().sum::<f64>() / added.len() as f64,
            max: added.iter().cloned().fold(f64::MIN, f64::max),
        }
    }
}

/// KOALA's figures (seed 001, section 5) of a run with its workload:
/// utilisation, co-allocated share, and placement time and start delay
/// by job size and priority.
pub struct Koala {
    jobs: usize,
    utilisation: f64,
    grid_share: f64,
    rows: Vec<KoalaRow>,
}

struct KoalaRow {
    size: u32,
    priority: gleaner_manifest::Priority,
    jobs: usize,
    done: usize,
    coallocated: f64,
    placement_s: f64,
    start_delay_s: f64,
    claiming_tries: f64,
    /// Runs given up, per job: KOALA's failures.
    restarts: f64,
    preemptions: f64,
    /// From submission to the end, of those that ended.
    makespan_s: f64,
}

impl Koala {
    pub fn of(run: &Run) -> Option<Self> {
        if run.grid_jobs.is_empty() {
            return None;
        }
        let total = f64::from(run.total_nodes.max(1)) * run.samples.len().max(1) as f64;
        let used: f64 = run
            .samples
            .iter()
            .map(|s| f64::from(s.local + s.grid))
            .sum();
        let grid: f64 = run.samples.iter().map(|s| f64::from(s.grid)).sum();
        let mut groups: BTreeMap<(u32, gleaner_manifest::Priority), Vec<&GridOutcome>> =
            BTreeMap::new();
        for job in &run.grid_jobs {
            groups
                .entry((job.size, job.priority))
                .or_default()
                .push(job);
        }
        let mean = |values: Vec<f64>| match values.is_empty() {
            true => f64::NAN,
            false => values.iter().sum::<f64>() / values.len() as f64,
        };
        let rows = groups
            .into_iter()
            .map(|((size, priority), jobs)| KoalaRow {
                size,
                priority,
                jobs: jobs.len(),
                done: jobs.iter().filter(|j| j.done).count(),
                coallocated: jobs.iter().filter(|j| j.coallocated).count() as f64
                    / jobs.len() as f64,
                placement_s: mean(jobs.iter().filter_map(|j| j.placement_s).collect()),
                start_delay_s: mean(jobs.iter().filter_map(|j| j.start_delay_s).collect()),
                claiming_tries: mean(jobs.iter().map(|j| f64::from(j.claiming_tries)).collect()),
                restarts: mean(jobs.iter().map(|j| f64::from(j.restarts)).collect()),
                preemptions: mean(jobs.iter().map(|j| f64::from(j.preemptions)).collect()),
                makespan_s: mean(jobs.iter().filter_map(|j| j.makespan_s).collect()),
            })
            .collect();
        Some(Self {
            jobs: run.grid_jobs.len(),
            utilisation: used / total,
            grid_share: grid / total,
            rows,
        })
    }

    pub fn text(&self) -> String {
        let mut out = format!(
            "\n  KOALA's co-allocation: {} grid jobs; utilisation {:.1} % ({:.1} % by grid jobs)\n  {:>5} {:<9} {:>5} {:>5} {:>13} {:>14} {:>16} {:>7} {:>9} {:>8} {:>14}\n",
            self.jobs,
            self.utilisation * 100.0,
            self.grid_share * 100.0,
            "size",
            "priority",
            "jobs",
            "done",
            "co-allocated",
            "placement (s)",
            "start delay (s)",
            "claims",
            "restarts",
            "stopped",
            "in system (s)"
        );
        for r in &self.rows {
            out.push_str(&format!(
                "  {:>5} {:<9} {:>5} {:>5} {:>12.0} % {:>14.1} {:>16.1} {:>7.2} {:>9.2} {:>8.2} {:>14.1}\n",
                r.size,
                r.priority.name(),
                r.jobs,
                r.done,
                r.coallocated * 100.0,
                r.placement_s,
                r.start_delay_s,
                r.claiming_tries,
                r.restarts,
                r.preemptions,
                r.makespan_s
            ));
        }
        out
    }

    pub fn json(&self) -> serde_json::Value {
        json!({
            "jobs": self.jobs,
            "utilisation": self.utilisation,
            "grid_share": self.grid_share,
            "groups": self.rows.iter().map(|r| json!({
                "size": r.size, "priority": r.priority.name(), "jobs": r.jobs, "done": r.done,
                "coallocated": r.coallocated, "placement_s": r.placement_s, "start_delay_s": r.start_delay_s,
                "claiming_tries": r.claiming_tries, "restarts": r.restarts, "preemptions": r.preemptions,
                "makespan_s": r.makespan_s,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Largest throughput difference between jobs, relative to the slowest.
pub fn spread(run: &Run) -> f64 {
    let throughputs: Vec<f64> = run.jobs.iter().map(|j| j.throughput).collect();
    let min = throughputs.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = throughputs.iter().cloned().fold(0.0, f64::max);
    if min > 0.0 {
        (max - min) / min
    } else {
        f64::INFINITY
    }
}

impl Comparison {
    /// Runs the baseline and every policy the scenario names (or both).
    pub fn run(scenario: &Scenario, only: Option<CsPolicy>) -> Self {
        let policies = match only {
            Some(policy) => vec![policy],
            None => scenario.policies(),
        };
        Self {
            scenario: scenario.name.clone(),
            baseline: simulate(scenario, None),
            runs: policies
                .into_iter()
                .map(|p| simulate(scenario, Some(p)))
                .collect(),
            study: (scenario.reallocation_seeds > 0)
                .then(|| study::Study::run(scenario, scenario.reallocation_seeds)),
        }
    }

    pub fn local_delay(&self, run: &Run) -> AddedDelay {
        AddedDelay::between(&run.local_waits, &self.baseline.local_waits)
    }

    pub fn grid_delay(&self, run: &Run) -> AddedDelay {
        AddedDelay::between(&run.grid_waits, &self.baseline.grid_waits)
    }

    pub fn text(&self) -> String {
        let mut out = format!("{}\n", self.scenario);
        if let Some(koala) = Koala::of(&self.baseline).filter(|_| self.study.is_none()) {
            out.push_str(&koala.text());
        }
        if let Some(study) = &self.study {
            out.push_str(&study.text());
        }
        // Without scavenging jobs there is nothing to compare by policy.
        for run in self.runs.iter().filter(|run| !run.jobs.is_empty()) {
            let policy = run.policy.map_or("none", CsPolicy::name);
            out.push_str(&format!(
                "\n  {policy}\n  {:<12} {:>8} {:>10} {:>10} {:>12} {:>14}\n",
                "job", "done", "tasks/s", "time-outs", "preemptions", "work lost (h)"
            ));
            for job in &run.jobs {
                out.push_str(&format!(
                    "  {:<12} {:>8} {:>10.4} {:>10} {:>12} {:>14.1}\n",
                    job.name,
                    job.done,
                    job.throughput,
                    job.timeouts,
                    job.preemptions,
                    job.lost_hours
                ));
            }
            let local = self.local_delay(run);
            let grid = self.grid_delay(run);
            out.push_str(&format!(
                "  throughput spread {:.1} %\n  local jobs: {} compared, added wait {:.1} s mean, {:.1} s worst\n  grid jobs: {} compared, added wait {:.1} s mean, {:.1} s worst\n",
                spread(run) * 100.0,
                local.jobs,
                local.mean,
                local.max,
                grid.jobs,
                grid.mean,
                grid.max
            ));
        }
        out
    }

    pub fn json(&self) -> serde_json::Value {
        let runs: Vec<_> = self
            .runs
            .iter()
            .map(|run| {
                let local = self.local_delay(run);
                let grid = self.grid_delay(run);
                json!({
                    "policy": run.policy.map(CsPolicy::name),
                    "jobs": run.jobs.iter().map(|j| json!({
                        "name": j.name, "done": j.done, "throughput": j.throughput, "timeouts": j.timeouts, "preemptions": j.preemptions, "lost_hours": j.lost_hours,
                    })).collect::<Vec<_>>(),
                    "spread": spread(run),
                    "local_added_wait": { "jobs": local.jobs, "mean_s": local.mean, "max_s": local.max },
                    "grid_added_wait": { "jobs": grid.jobs, "mean_s": grid.mean, "max_s": grid.max },
                })
            })
            .collect();
        let koala = Koala::of(&self.baseline).map(|k| k.json());
        let reallocation = self.study.as_ref().map(study::Study::json);
        json!({ "scenario": self.scenario, "runs": runs, "koala": koala, "reallocation": reallocation })
    }

    /// Writes one PNG per policy into `dir`: the grid's load over time.
    pub fn plot(&self, dir: &Path, stem: &str) -> Result<Vec<std::path::PathBuf>, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut files: Vec<std::path::PathBuf> = self
            .runs
            .iter()
            .map(|run| {
                let policy = run.policy.map_or("none", CsPolicy::name);
                let path = dir.join(format!("{stem}-{policy}.png"));
                plot::load(run, &format!("{} — {policy}", self.scenario), &path)?;
                Ok(path)
            })
            .collect::<Result<_, String>>()?;
        if let Some(study) = &self.study {
            let path = dir.join(format!("{stem}-reallocation.png"));
            study.box_plot(&path)?;
            files.push(path);
        }
        Ok(files)
    }
}

#[cfg(test)]
mod tests;
