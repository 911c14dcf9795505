//! Pictures of the benchmarks' tables, drawn from the Markdown rows that
//! `bench/run.sh` printed, with the simulator's plotting.

use std::path::Path;

use anyhow::Context;
use gleaner_simulator::plot::{Line, lines};

/// The cells of the table rows in `text` whose first cell is one of
/// `firsts` (the batch systems), trimmed.
fn rows<'a>(text: &'a str, firsts: &[&str]) -> Vec<Vec<&'a str>> {
    text.lines()
        .filter_map(|line| line.trim().strip_prefix('|')?.strip_suffix('|'))
        .map(|inner| inner.split('|').map(str::trim).collect::<Vec<_>>())
        .filter(|cells| cells.first().is_some_and(|c| firsts.contains(c)))
        .collect()
}

/// The leading number of a cell ("84.1 (80.2–90.3)" gives 84.1).
fn number(cell: &str) -> Option<f64> {
    cell.split_whitespace()
        .next()?
        .trim_start_matches('+')
        .parse()
        .ok()
}

const BATCH_SYSTEMS: [&str; 3] = ["local backend", "Grid Engine", "Slurm"];

/// Seed 004's Figure 4.4: grant to every launcher connected, against the
/// launchers, one line per batch system.
pub fn figure_4_4(table: &Path, out: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(table).with_context(|| table.display().to_string())?;
    let series: Vec<Line> = BATCH_SYSTEMS
        .iter()
        .map(|batch| {
            let points = rows(&text, &[batch])
                .iter()
                .filter(|cells| cells.len() >= 3)
                .filter_map(|cells| Some((number(cells[1])?, number(cells[2])?)))
                .collect();
            ((*batch).to_owned(), points)
        })
        .filter(|(_, points): &Line| !points.is_empty())
        .collect();
    anyhow::ensure!(
        !series.is_empty(),
        "no Figure 4.4 rows in {}",
        table.display()
    );
    lines(
        "Seed 004, Figure 4.4: from a grant to every launcher connected",
        ("launchers", "seconds"),
        &series,
        out,
    )
    .map_err(anyhow::Error::msg)
}

/// Seed 000's Table 4.2: each local job's makespan against its number of
/// chunks, on the empty grid and on the grid full of launchers, per batch
/// system, with the thesis's two lines.
pub fn table_4_2(table: &Path, out: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(table).with_context(|| table.display().to_string())?;
    let chunks = |cell: &str| number(cell.split('×').next().unwrap_or(""));
    let mut series: Vec<Line> = Vec::new();
    for batch in &BATCH_SYSTEMS[1..] {
        let found = rows(&text, &[batch]);
        for (column, when) in [(2, "empty"), (3, "full of launchers")] {
            let points: Vec<(f64, f64)> = found
                .iter()
                .filter(|cells| cells.len() >= 8)
                .filter_map(|cells| Some((chunks(cells[1])?, number(cells[column])?)))
                .collect();
            if !points.is_empty() {
                series.push((format!("{batch}, {when}"), points));
            }
        }
    }
    anyhow::ensure!(
        !series.is_empty(),
        "no Table 4.2 rows in {}",
        table.display()
    );
    for (column, when) in [(5, "empty"), (6, "full")] {
        let points = rows(&text, &[BATCH_SYSTEMS[1]])
            .iter()
            .filter(|cells| cells.len() >= 8)
            .filter_map(|cells| Some((chunks(cells[1])?, number(cells[column])?)))
            .collect();
        series.push((format!("seed 000 (DAS-3), {when}"), points));
    }
    lines(
        "Seed 000, Table 4.2: makespan of 40 × 60 s local jobs",
        ("chunks", "makespan (s)"),
        &series,
        out,
    )
    .map_err(anyhow::Error::msg)
}
