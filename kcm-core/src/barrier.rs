//! What the kcm writes at a grid component's start barrier, for its
//! wrapper to read: the core decides it, the shell writes it.

use gleaner_protocol::HostSlots;

/// What the kcm writes to `go` for a component whose first rank is
/// `rank` of the job's `ranks`, of `components` components: the
/// wrapper reads it into `GLEANER_RANK`, `GLEANER_RANKS` and
/// `GLEANER_COMPONENTS`.
pub fn go_text(rank: u32, ranks: u32, components: u32) -> String {
    format!("{rank} {ranks} {components}\n")
}

/// What the kcm writes to `hosts`: an MPI host file of every
/// component's hosts in component order, `host slots=N`, with the
/// component each line belongs to after a `#`.
pub fn hosts_text(hosts: &[Vec<HostSlots>]) -> String {
    let mut text = String::new();
    for (component, hosts) in hosts.iter().enumerate() {
        for h in hosts {
            text.push_str(&format!(
                "{} slots={} # component {component}\n",
                h.host, h.slots
            ));
        }
    }
    text
}
