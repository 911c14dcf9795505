//! Throughput side by side: the spawn floor, HyperQueue (when given) and
//! gleaner's rows, in rounds whose order rotates so that no contender
//! always runs first on a warm or a cold machine; medians at the end.

use std::path::Path;

use crate::{
    hq::{self, HqOutput},
    measure,
};

/// One row of a round.
enum Contender<'a> {
    Hq {
        hq: &'a Path,
        slots: u32,
        output: HqOutput,
    },
    Gleaner(measure::Throughput<'a>),
}

impl Contender<'_> {
    fn label(&self) -> String {
        match self {
            Contender::Hq { slots, output, .. } => format!(
                "HyperQueue, 1 worker × {slots}, `/usr/bin/true`{}",
                output.label()
            ),
            Contender::Gleaner(run) => format!(
                "gleaner, {} × {}, `{}`, bundle {}",
                run.launchers,
                run.launcher_slots,
                run.command,
                measure::bundle_label(run.bundle)
            ),
        }
    }

    fn slots(&self) -> u32 {
        match self {
            Contender::Hq { slots, .. } => *slots,
            Contender::Gleaner(run) => run.launchers * run.launcher_slots,
        }
    }
}

/// What the rounds run.
pub struct Plan<'a> {
    pub tasks: u32,
    pub launcher_slots: u32,
    pub launchers: &'a [u32],
    /// gleaner's rows at each size: command and tasks per message.
    pub runs: &'a [(&'a str, Option<u32>)],
    pub hq: Option<&'a Path>,
    pub rounds: u32,
}

pub fn throughput(exe: &Path, plan: &Plan<'_>) -> anyhow::Result<()> {
    let mut contenders = Vec::new();
    for &launchers in plan.launchers {
        if let Some(hq) = plan.hq {
            for output in HqOutput::ALL {
                let slots = launchers * plan.launcher_slots;
                contenders.push(Contender::Hq { hq, slots, output });
            }
        }
        for &(command, bundle) in plan.runs {
            contenders.push(Contender::Gleaner(measure::Throughput {
                tasks: plan.tasks,
                launchers,
                launcher_slots: plan.launcher_slots,
                command,
                bundle,
            }));
        }
    }
    let mut floors = Vec::new();
    let mut rates = vec![Vec::new(); contenders.len()];
    for round in 0..plan.rounds as usize {
        println!("round {}", round + 1);
        floors.push(measure::spawn_rate(std::time::Duration::from_secs(5))?);
        for i in (0..contenders.len()).map(|i| (i + round) % contenders.len()) {
            let rate = match &contenders[i] {
                Contender::Hq { hq, slots, output } => {
                    hq::throughput(hq, plan.tasks, *slots, *output)?
                }
                Contender::Gleaner(run) => measure::throughput(exe, run)?,
            };
            rates[i].push(rate);
        }
    }
    if plan.rounds < 2 {
        return Ok(());
    }
    let floor = median(&mut floors);
    println!(
        "\nmedians of {} rounds; spawn floor (`/usr/bin/true`, 2 at a time): {floor:.0}/s\n",
        plan.rounds
    );
    println!(
        "| contender | tasks/s (rounds) | median | × HyperQueue (files, --stream, no capture) | % of the spawn floor |"
    );
    println!("|---|---|---:|---:|---:|");
    let medians: Vec<f64> = rates.iter_mut().map(|r| median(r)).collect();
    let hq_of = |slots: u32, output: HqOutput| {
        contenders.iter().zip(&medians).find_map(|(c, m)| match c {
            Contender::Hq {
                slots: s,
                output: o,
                ..
            } if *s == slots && *o == output => Some(*m),
            _ => None,
        })
    };
    for ((contender, all), median) in contenders.iter().zip(&rates).zip(&medians) {
        let versus = match contender {
            Contender::Gleaner(_) => HqOutput::ALL
                .map(|output| {
                    hq_of(contender.slots(), output)
                        .map_or("–".to_owned(), |hq| format!("{:.2}", median / hq))
                })
                .join(", "),
            Contender::Hq { .. } => "–".to_owned(),
        };
        let all: Vec<String> = all.iter().map(|r| format!("{r:.0}")).collect();
        println!(
            "| {} | {} | **{median:.0}** | {versus} | {:.0} % |",
            contender.label(),
            all.join(", "),
            100.0 * median / floor
        );
    }
    Ok(())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}
