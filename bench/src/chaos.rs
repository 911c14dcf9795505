//! The chaos suite, long: every kind of fault, again and again, over one
//! sweep; what was lost or duplicated, and how long the job took to get
//! over each kind of fault.

use std::{path::Path, time::Duration};

use gleaner_testkit::chaos::{self, Fault, Plan};

pub fn run(exe: &Path, tasks: u32, task_seconds: f64, pause: (u64, u64)) -> anyhow::Result<()> {
    let faults = vec![
        Fault::Scheduler,
        Fault::Runner,
        Fault::Kcm,
        Fault::Launcher,
        Fault::BrokerNode,
        Fault::BrokerRestart,
        Fault::HostCut,
    ];
    let plan = Plan {
        tasks,
        task_seconds,
        faults: faults.clone(),
        pause: (Duration::from_secs(pause.0), Duration::from_secs(pause.1)),
        timeout: Duration::from_secs(3 * 3600),
    };
    let exe = exe
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("a gleaner path that is not UTF-8"))?;
    let outcome = chaos::run(exe, &plan);
    let peak: Vec<String> = outcome
        .peak
        .iter()
        .map(|(cluster, (peak, slots))| format!("{cluster} {peak}/{slots}"))
        .collect();
    println!(
        "| {} | {} × {task_seconds} s | {:.0} | {} | {} | {} | {} | {} | {} |",
        outcome.faults.len(),
        outcome.tasks,
        outcome.makespan.as_secs_f64(),
        outcome.state,
        outcome.lost.len(),
        outcome.duplicated,
        outcome.failed,
        peak.join(", "),
        outcome.leftovers.len(),
    );
    println!();
    println!("| fault | injected | recovered | recovery mean (s) | recovery worst (s) |");
    println!("|---|---|---|---|---|");
    for fault in faults {
        let injected: Vec<_> = outcome.faults.iter().filter(|f| f.fault == fault).collect();
        let recovered: Vec<f64> = injected
            .iter()
            .filter_map(|f| f.recovery.map(|r| r.as_secs_f64()))
            .collect();
        let mean = recovered.iter().sum::<f64>() / recovered.len().max(1) as f64;
        let worst = recovered.iter().copied().fold(0.0, f64::max);
        println!(
            "| {} | {} | {} | {mean:.1} | {worst:.1} |",
            fault.name(),
            injected.len(),
            recovered.len()
        );
    }
    anyhow::ensure!(outcome.kept(), "a promise was broken: {outcome:#?}");
    Ok(())
}
