//! The test hosts of `deploy/sge/hosts.sh` (network namespaces): the
//! replicated broker on them, and a host cut off from the broker.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

use crate::*;

/// The replicated broker of `deploy/rabbitmq/cluster.sh`, one test at a
/// time: a test that takes a node down holds a lock on the cluster, and
/// every node is running again when it ends.
pub struct BrokerCluster {
    _lock: nix::fcntl::Flock<std::fs::File>,
    pub access: BrokerAccess,
}

impl BrokerCluster {
    pub const NODES: [&str; 3] = ["node1", "node2", "node3"];

    pub fn lock() -> Self {
        let cluster = Self {
            _lock: exclusive("gleaner-broker-cluster-tests.lock"),
            access: BrokerAccess::cluster(),
        };
        for node in Self::NODES {
            cluster.start(node);
        }
        cluster
    }

    /// Kills a node's broker, as a crash would.
    pub fn stop(&self, node: &str) {
        Self::script(&["stop", node]).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Starts a node's broker again (nothing if it runs); it rejoins.
    pub fn start(&self, node: &str) {
        Self::script(&["start", node]).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Stops every node, then starts the cluster again (its nodes boot
    /// together, each waiting for the others).
    pub fn restart(&self) {
        for node in Self::NODES {
            self.stop(node);
        }
        Self::script(&["up"]).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Raises RabbitMQ's memory alarm on every node (each takes none of
    /// its memory to be too much), so that the cluster blocks every
    /// publishing connection; it clears when the returned guard is dropped.
    pub fn memory_alarm(&self) -> MemoryAlarm {
        for node in Self::NODES {
            Self::script(&["ctl", node, "set_vm_memory_high_watermark", "absolute", "1"])
                .unwrap_or_else(|e| panic!("{e}"));
        }
        MemoryAlarm
    }

    /// The node (`node2`) a client's connection is on, by its connection
    /// name (`runner@vm`), in a vhost.
    pub fn node_of(&self, vhost: &Vhost, connection: &str) -> Option<String> {
        let text = vhost
            .api("GET", &format!("/vhosts/{}/connections", vhost.name), None)
            .ok()?;
        let connections: Vec<Value> = serde_json::from_str(&text).ok()?;
        connections
            .iter()
            .find(|c| c["client_properties"]["connection_name"] == connection)
            .and_then(|c| c["node"].as_str())
            .map(|node| node.trim_start_matches("rabbit@").to_owned())
    }

    fn script(args: &[&str]) -> Result<(), String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/rabbitmq/cluster.sh");
        let output = Command::new(&script)
            .args(args)
            .output()
            .map_err(|e| format!("run {}: {e}", script.display()))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "cluster.sh {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }
}

/// The replicated broker's memory alarm ([`BrokerCluster::memory_alarm`]),
/// cleared when dropped.
pub struct MemoryAlarm;

impl Drop for MemoryAlarm {
    fn drop(&mut self) {
        for node in BrokerCluster::NODES {
            if let Err(e) =
                BrokerCluster::script(&["ctl", node, "set_vm_memory_high_watermark", "0.4"])
            {
                eprintln!("{e}");
            }
        }
    }
}

impl Drop for BrokerCluster {
    fn drop(&mut self) {
        for node in Self::NODES {
            if let Err(e) = Self::script(&["start", node]) {
                eprintln!("{e}");
            }
        }
    }
}

/// A test host of a test's own (`deploy/grid/hosts.sh island`): a network
/// namespace with loopback and the broker forwarders only, whose broker
/// traffic the test can cut (dropped, as by a network fault) and mend.
/// Removed, with everything still running in it, when the test ends.
pub struct Island {
    pub name: String,
}

impl Island {
    pub fn new(test: &str) -> Self {
        let island = Self {
            name: format!("{test}{}", std::process::id()),
        };
        island.hosts(&["island"]);
        island
    }

    /// The namespace (`ip netns exec NAMESPACE …` runs a command there).
    pub fn namespace(&self) -> String {
        format!("gleaner-{}", self.name)
    }

    pub fn cut(&self) {
        self.hosts(&["cut"]);
    }

    pub fn mend(&self) {
        self.hosts(&["mend"]);
    }

    /// The processes running in the island: pid, command (`comm`).
    pub fn processes(&self) -> Vec<(u32, String)> {
        let output = Command::new("ip")
            .args(["netns", "pids", &self.namespace()])
            .output()
            .expect("ip netns pids");
        String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .filter_map(|pid| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
                Some((pid.parse().ok()?, comm.trim().to_owned()))
            })
            .collect()
    }

    fn hosts(&self, command: &[&str]) {
        let output = Command::new(grid_script())
            .args(command)
            .arg(&self.name)
            .output()
            .expect("deploy/grid/hosts.sh");
        assert!(
            output.status.success(),
            "hosts.sh {command:?} {}: {} (is the dev grid up? deploy/sge/hosts.sh)",
            self.name,
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for Island {
    fn drop(&mut self) {
        let _ = Command::new(grid_script())
            .args(["remove", &self.name])
            .output();
    }
}

fn grid_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grid/hosts.sh")
}
