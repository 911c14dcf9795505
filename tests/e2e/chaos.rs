//! The chaos suite, short: one sweep over the replicated broker while a
//! scheduler, a runner, a kcm, a launcher and a broker node are killed, in
//! random order, and then more at random. (`gleaner-bench chaos` is the long
//! run.)

use std::time::Duration;

use gleaner_testkit::chaos::{self, Fault, Plan};

#[test]
fn every_task_ends_once_whatever_is_killed() {
    let outcome = chaos::run(
        env!("CARGO_BIN_EXE_gleaner"),
        &Plan {
            tasks: 600,
            task_seconds: 0.5,
            faults: Fault::COMPONENTS.to_vec(),
            pause: (Duration::from_secs(2), Duration::from_secs(4)),
            timeout: Duration::from_secs(300),
        },
    );
    eprintln!("{outcome:#?}");
    let injected: Vec<Fault> = outcome.faults.iter().map(|f| f.fault).collect();
    assert!(
        Fault::COMPONENTS.iter().all(|f| injected.contains(f)),
        "every kind of fault was injected: {injected:?}"
    );
    assert_eq!(outcome.state, "done");
    assert!(
        outcome.lost.is_empty(),
        "tasks without a line: {:?}",
        outcome.lost
    );
    assert_eq!(outcome.duplicated, 0, "tasks with more than one line");
    assert_eq!(outcome.failed, 0, "tasks that did not succeed");
    for (cluster, (peak, slots)) in &outcome.peak {
        assert!(
            *peak <= *slots as usize,
            "{cluster} ran {peak} tasks at once on {slots} slots"
        );
        assert!(*peak > 0, "{cluster} ran tasks");
    }
    assert!(
        outcome.leftovers.is_empty(),
        "left running: {:#?}",
        outcome.leftovers
    );
    assert!(outcome.kept());
}
