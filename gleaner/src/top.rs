//! `gleaner top`: a live view of the grid — clusters and their slots by
//! kind, jobs and their progress, recent events — like `htop` for a sweep.
//! `View` and `draw` are pure (a status and events in, a frame out); the
//! shell asks the scheduler every second and follows the user's events.

use std::{collections::VecDeque, io::IsTerminal, time::Duration};

use gleaner_broker::topology;
use gleaner_protocol::{Event, RequestMsg, StatusReply};
use ratatui::{
    Frame,
    crossterm::event::{self, KeyCode, KeyEventKind, KeyModifiers},
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Cell, Paragraph, Row, Table},
};

use crate::{client, error::CliError, settings::Settings};

/// How many recent events the view keeps.
const EVENTS: usize = 50;

/// What the screen shows.
#[derive(Debug, Default)]
pub struct View {
    pub status: Option<StatusReply>,
    /// Newest first.
    pub events: VecDeque<String>,
    /// Why the last refresh failed, if it did.
    pub problem: Option<String>,
    /// When the picture was taken (`HH:MM:SS`, UTC).
    pub at: String,
}

impl View {
    /// One event, as a line: ends and refusals (progress is in the table).
    pub fn hear(&mut self, at: &str, event: &Event) {
        let line = match event {
            Event::Done(report) => format!(
                "{at} {} {:?}: {} of {} tasks succeeded",
                report.job, report.state, report.tasks.succeeded, report.tasks.total
            ),
            Event::Rejected { job, reason, .. } => format!("{at} {job} refused: {reason}"),
            Event::Progress(_) | Event::Cluster(_) => return,
        };
        self.events.push_front(line);
        self.events.truncate(EVENTS);
    }
}

/// A bar of `width` cells, `done` of `total` filled.
fn bar(done: u64, total: u64, width: usize) -> String {
    let filled = if total == 0 {
        0
    } else {
        (done.min(total) as usize * width) / total as usize
    };
    format!("{}{}", "█".repeat(filled), "░".repeat(width - filled))
}

pub fn draw(frame: &mut Frame, view: &View) {
    let [head, clusters, jobs, events, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Percentage(30),
        Constraint::Percentage(40),
        Constraint::Fill(1),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    let title = match &view.status {
        Some(s) => format!(
            "gleaner · scheduler {} ({}) · {}",
            s.scheduler, s.policy, view.at
        ),
        None => format!("gleaner · waiting for the scheduler · {}", view.at),
    };
    frame.render_widget(
        Paragraph::new(title).style(Style::new().add_modifier(Modifier::BOLD)),
        head,
    );
    let header = |names: &[&'static str]| {
        Row::new(names.iter().map(|n| Cell::from(*n)))
            .style(Style::new().add_modifier(Modifier::REVERSED))
    };
    let status = view.status.as_ref();

    let rows = status
        .into_iter()
        .flat_map(|s| &s.clusters)
        .map(|c| Row::new(crate::table::cluster_row(c)));
    let widths = [
        Constraint::Length(14),
        Constraint::Length(8),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(10),
        Constraint::Length(6),
        Constraint::Length(8),
        Constraint::Length(9),
        Constraint::Length(10),
        Constraint::Fill(1),
    ];
    frame.render_widget(
        Table::new(rows, widths)
            .header(header(&crate::table::CLUSTER_COLUMNS))
            .block(Block::bordered().title(" clusters ")),
        clusters,
    );

    let rows = status.into_iter().flat_map(|s| &s.jobs).map(|j| {
        let t = &j.tasks;
        let launchers: u32 = j.launchers.values().sum();
        Row::new([
            j.job.to_string(),
            j.owner.clone(),
            crate::table::state(j),
            format!(
                "{} {}/{}",
                bar(t.finished(), t.total, 12),
                t.finished(),
                t.total
            ),
            t.running.to_string(),
            (t.failed + t.timed_out + t.lost).to_string(),
            launchers.to_string(),
            format!("{:.1}", j.throughput),
            j.preemptions.to_string(),
        ])
    });
    let widths = [
        Constraint::Length(24),
        Constraint::Length(10),
        Constraint::Length(12),
        Constraint::Length(28),
        Constraint::Length(8),
        Constraint::Length(7),
        Constraint::Length(10),
        Constraint::Length(8),
        Constraint::Fill(1),
    ];
    frame.render_widget(
        Table::new(rows, widths)
            .header(header(&[
                "JOB",
                "OWNER",
                "STATE",
                "PROGRESS",
                "RUNNING",
                "FAILED",
                "LAUNCHERS",
                "TASKS/S",
                "PREEMPTIONS",
            ]))
            .block(Block::bordered().title(" jobs ")),
        jobs,
    );

    let lines: Vec<Line> = view.events.iter().map(|e| Line::from(e.as_str())).collect();
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" recent events ")),
        events,
    );
    let foot_text = match &view.problem {
        Some(problem) => format!("q quits · {problem}"),
        None => "q quits".to_owned(),
    };
    frame.render_widget(Paragraph::new(foot_text), foot);
}

/// `HH:MM:SS` of the wall clock, UTC.
fn clock() -> String {
    let secs = gleaner_protocol::now_ms() / 1000;
    format!(
        "{:02}:{:02}:{:02}",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60
    )
}

/// The shell: the terminal, the scheduler every second, the user's events.
pub async fn top(settings: &Settings) -> Result<(), CliError> {
    if !std::io::stdout().is_terminal() {
        return Err(CliError::BadInput(
            "gleaner top needs a terminal (for scripts: gleaner status --json)".to_owned(),
        ));
    }
    let connection = client::connect(settings).await?;
    let user = connection.user().to_owned();
    let queue = topology::watch_queue_for(&user, &format!("top-{:08x}", rand::random::<u32>()));
    let mut events = match connection.publisher().await {
        Ok(publisher) => connection
            .follow(
                &publisher,
                &queue,
                &format!("job.{user}.#"),
                client::WATCH_EXPIRY,
            )
            .await
            .ok(),
        Err(_) => None,
    };
    // Keys are read on a thread of their own: the terminal's reads block.
    let (keys, mut pressed) = tokio::sync::mpsc::channel(8);
    std::thread::spawn(move || {
        while let Ok(event) = event::read() {
            if let event::Event::Key(key) = event
                && key.kind == KeyEventKind::Press
                && keys.blocking_send(key).is_err()
            {
                break;
            }
        }
    });
    let mut terminal = ratatui::try_init()
        .map_err(|e| CliError::BadInput(format!("cannot use the terminal: {e}")))?;
    let mut view = View::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let outcome = loop {
        tokio::select! {
            _ = tick.tick() => {
                view.at = clock();
                match client::ask::<StatusReply>(&connection, &RequestMsg::Status { job: None }).await {
                    Ok(status) => {
                        view.status = Some(status);
                        view.problem = None;
                    }
                    Err(e) => view.problem = e.message(),
                }
            }
            Some(key) = pressed.recv() => {
                let quit = matches!(key.code, KeyCode::Char('q') | KeyCode::Esc)
                    || (key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL));
                if quit {
                    break Ok(());
                }
            }
            Some(Ok(incoming)) = async {
                match events.as_mut() {
                    Some(inbox) => inbox.next().await,
                    None => std::future::pending().await,
                }
            } => {
                let _ = incoming.ack().await;
                view.hear(&clock(), &incoming.msg);
            }
        }
        if let Err(e) = terminal.draw(|frame| draw(frame, &view)) {
            break Err(CliError::BadInput(format!("cannot draw: {e}")));
        }
    };
    ratatui::restore();
    connection.forget(&queue).await;
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::{Terminal, backend::TestBackend};

    #[test]
    fn the_view_shows_clusters_jobs_and_ends() {
        let report: gleaner_protocol::JobReport = serde_json::from_value(serde_json::json!({
            "job": "sweep-3fa9c2d41e07b5a8", "owner": "alice", "kind": "scavenge", "priority": "super-low",
            "state": "running", "runner": "r",
            "tasks": {"total": 100, "pending": 50, "running": 10, "succeeded": 40, "failed": 0,
                      "timed_out": 0, "lost": 0, "cancelled": 0},
            "launchers": {"c1": 10}, "throughput": 2.5, "preemptions": 3, "started_at": 0,
            "results": "/r", "components": [], "max_slots": null, "problem": null
        }))
        .unwrap();
        let mut view = View {
            status: Some(StatusReply {
                scheduler: "scheduler@head".into(),
                policy: "site-equipartition".into(),
                clusters: Vec::new(),
                jobs: vec![report.clone()],
                placements: Vec::new(),
                hidden: 0,
                ended: Vec::new(),
            }),
            at: "12:00:00".into(),
            ..View::default()
        };
        let mut done = report;
        done.state = gleaner_protocol::JobState::Done;
        view.hear("12:00:01", &Event::Done(done));
        let mut terminal = Terminal::new(TestBackend::new(140, 30)).unwrap();
        terminal.draw(|frame| draw(frame, &view)).unwrap();
        let screen: String = terminal
            .backend()
            .buffer()
            .content()
            .iter()
            .map(|c| c.symbol())
            .collect();
        assert!(screen.contains("sweep-3fa9c2d41e07b5a8"), "{screen}");
        assert!(screen.contains("40/100"), "{screen}");
        assert!(
            screen.contains("12:00:01 sweep-3fa9c2d41e07b5a8 Done: 40 of 100"),
            "{screen}"
        );
        assert_eq!(bar(40, 100, 10), "████░░░░░░");
    }
}
