//! The simulator on the seed 000 scenarios: fairness per policy and workload.

use std::path::Path;

use gleaner_simulator::{Comparison, Scenario, spread};

pub fn scenarios(dir: &Path) -> anyhow::Result<()> {
    for workload in ["free", "block", "spike"] {
        let path = dir.join(format!("das3-{workload}.toml"));
        let text = std::fs::read_to_string(&path)?;
        let scenario =
            Scenario::from_toml(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let comparison = Comparison::run(&scenario, None);
        for run in &comparison.runs {
            let throughputs: Vec<String> = run
                .jobs
                .iter()
                .map(|j| format!("{:.4}", j.throughput))
                .collect();
            let preemptions: Vec<String> =
                run.jobs.iter().map(|j| j.preemptions.to_string()).collect();
            let local = comparison.local_delay(run);
            let grid = comparison.grid_delay(run);
            println!(
                "| {workload} | {} | {} | {} | **{:.1} %** | {:.1} / {:.1} | {} |",
                run.policy.map_or("none", |p| p.name()),
                throughputs.join(" / "),
                preemptions.join(" / "),
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
    }
    Ok(())
}
