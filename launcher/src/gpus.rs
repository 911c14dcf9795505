//! A launcher's GPUs: which devices its placeholder holds, and which of
//! them each running task has.
//!
//! Slurm assigns a job its devices (`$CUDA_VISIBLE_DEVICES`). Grid Engine
//! and the local backend only count GPUs; there, a launcher claims as many
//! of the host's devices as its placeholder was granted, each by binding an
//! abstract socket named after it. The kernel releases the name when the
//! launcher dies, however it dies, and the name is the host's own (one per
//! network namespace), so no file can be left stale; but any process of the
//! host may bind it first, so a launcher that finds devices the batch
//! system counted free claimed says which, for its kcm to judge.

use std::os::{linux::net::SocketAddrExt, unix::net::SocketAddr, unix::net::UnixListener};

/// Where a launcher's devices come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSource {
    /// The batch system set `$CUDA_VISIBLE_DEVICES` for the placeholder.
    BatchSystem,
    /// The host's devices, to claim from.
    Claim(Vec<String>),
}

/// Devices a launcher holds for its lifetime.
#[derive(Debug, Default)]
pub struct Held {
    pub devices: Vec<String>,
    /// The claims: dropped with the launcher.
    _claims: Vec<UnixListener>,
}

/// Why a launcher does not have the GPUs its tasks need.
#[derive(Debug, PartialEq, Eq)]
pub struct Short {
    pub reason: String,
    /// The host's devices another process had claimed, where the launcher
    /// claims its own: its kcm judges whether they are gleaner's.
    pub claimed: Vec<String>,
}

/// The `count` devices this launcher may give its tasks.
pub fn acquire(source: &GpuSource, count: u32) -> Result<Held, Short> {
    if count == 0 {
        return Ok(Held::default());
    }
    let wanted = count as usize;
    match source {
        GpuSource::BatchSystem => {
            let given = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default();
            let devices = device_list(&given);
            if devices.len() < wanted {
                return Err(Short {
                    reason: format!(
                        "the batch system gave this placeholder {} GPUs ($CUDA_VISIBLE_DEVICES={given:?}); its tasks need {count}",
                        devices.len()
                    ),
                    claimed: Vec::new(),
                });
            }
            Ok(Held {
                devices: devices.into_iter().take(wanted).collect(),
                _claims: Vec::new(),
            })
        }
        GpuSource::Claim(host) => {
            let mut held = Held::default();
            let mut claimed = Vec::new();
            for device in host {
                if held.devices.len() == wanted {
                    break;
                }
                match claim(device) {
                    Some(claim) => {
                        held.devices.push(device.clone());
                        held._claims.push(claim);
                    }
                    None => claimed.push(device.clone()),
                }
            }
            if held.devices.len() < wanted {
                return Err(Short {
                    reason: format!(
                        "only {} of this host's GPUs {host:?} are free (claimed: {claimed:?}); its tasks need {count}",
                        held.devices.len()
                    ),
                    claimed,
                });
            }
            Ok(held)
        }
    }
}

/// The host-wide claim on one device, unless another process holds it.
fn claim(device: &str) -> Option<UnixListener> {
    let name = format!("gleaner-gpu/{device}");
    let address = SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
    UnixListener::bind_addr(&address).ok()
}

/// `0,1, 3` as `["0", "1", "3"]`; `NoDevFiles` and empty entries are none.
fn device_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty() && *d != "NoDevFiles")
        .map(str::to_owned)
        .collect()
}

/// The held devices no running task has.
#[derive(Debug, Default)]
pub struct Pool {
    free: Vec<String>,
}

impl Pool {
    pub fn new(devices: &[String]) -> Self {
        Self {
            free: devices.iter().rev().cloned().collect(),
        }
    }

    /// `count` devices for a task about to run, lowest first; `None` if
    /// fewer are free (a launcher runs only as many tasks as it holds
    /// devices for, so this does not happen).
    pub fn take(&mut self, count: u32) -> Option<Vec<String>> {
        let count = count as usize;
        let at = self.free.len().checked_sub(count)?;
        let mut taken = self.free.split_off(at);
        taken.reverse();
        Some(taken)
    }

    /// A task's devices, free again once it has ended.
    pub fn give_back(&mut self, devices: Vec<String>) {
        self.free.extend(devices.into_iter().rev());
        self.free.sort_by(|a, b| b.cmp(a));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_task_gets_devices_no_other_running_task_has() {
        let held: Vec<String> = ["0", "1", "2", "3"].map(String::from).into();
        let mut pool = Pool::new(&held);
        let first = pool.take(2).unwrap();
        let second = pool.take(1).unwrap();
        assert_eq!(first, ["0", "1"]);
        assert_eq!(second, ["2"]);
        assert_eq!(pool.take(2), None, "one left");
        pool.give_back(first);
        assert_eq!(pool.take(3).unwrap(), ["0", "1", "3"]);
        assert_eq!(pool.take(0).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn batch_system_lists_are_read_as_devices() {
        assert_eq!(device_list("0, 2,,3"), ["0", "2", "3"]);
        assert!(device_list("NoDevFiles").is_empty());
        assert!(device_list("").is_empty());
    }

    #[test]
    fn a_device_is_claimed_by_one_launcher_at_a_time() {
        let device = format!("test-{}", std::process::id());
        let host = GpuSource::Claim(vec![device.clone()]);
        let first = acquire(&host, 1).unwrap();
        assert_eq!(first.devices, std::slice::from_ref(&device));
        let refused = acquire(&host, 1).unwrap_err();
        assert!(refused.reason.contains("only 0"), "{refused:?}");
        assert_eq!(
            refused.claimed,
            std::slice::from_ref(&device),
            "for its kcm"
        );
        drop(first);
        assert_eq!(acquire(&host, 1).unwrap().devices, [device]);
    }
}
