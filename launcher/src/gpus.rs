//! A launcher's GPUs: which devices its placeholder holds, and which of
//! them each running task has.
//!
//! Slurm assigns a job its devices (`$CUDA_VISIBLE_DEVICES`). The local
//! backend's kcm claims them for the launcher it starts and hands it the
//! claims (open lock files of the kcm's account, which no other account can
//! take). Grid Engine only counts GPUs; there, a launcher claims as many of
//! the host's devices as its placeholder was granted, each by binding an
//! abstract socket named after it. The kernel releases the name when the
//! launcher dies, however it dies, and the name is the host's own (one per
//! network namespace), so no file can be left stale; but any process of the
//! host may bind it first, so a launcher that finds devices the batch
//! system counted free claimed says which, for its kcm to judge.

use std::os::{
    fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    linux::net::SocketAddrExt,
    unix::net::SocketAddr,
    unix::net::UnixListener,
};

use crate::GpuSource;

/// Devices a launcher holds for its lifetime.
#[derive(Debug, Default)]
pub struct Held {
    pub devices: Vec<String>,
    /// The claims: dropped with the launcher.
    _claims: Vec<OwnedFd>,
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
                        held._claims.push(claim.into());
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
        GpuSource::Given { devices, claims } => {
            let mut held = Held::default();
            for (device, fd) in devices.iter().zip(claims) {
                let claim = adopt(*fd).map_err(|e| Short {
                    reason: format!("the kcm's claim on GPU {device} (descriptor {fd}): {e}"),
                    claimed: Vec::new(),
                })?;
                held.devices.push(device.clone());
                held._claims.push(claim);
            }
            if held.devices.len() < wanted {
                return Err(Short {
                    reason: format!(
                        "the kcm claimed {} GPUs for this launcher; its tasks need {count}",
                        held.devices.len()
                    ),
                    claimed: Vec::new(),
                });
            }
            // Its tasks run as its account: not dumpable, it cannot be
            // traced by them (nor its descriptors taken with
            // `pidfd_getfd`), so none can take a claim out and hold a
            // device past it.
            let _ = nix::sys::prctl::set_dumpable(false);
            Ok(held)
        }
    }
}

/// The kcm's claim on a device, handed down as the open descriptor `fd`:
/// kept for the launcher's life, and closed at any `exec`, so that no task
/// holds it.
fn adopt(fd: i32) -> Result<OwnedFd, String> {
    if fd <= 2 {
        return Err("not a claim".to_owned());
    }
    // SAFETY: only looked at; a number that is not open fails `fstat`.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let stat = nix::sys::stat::fstat(borrowed).map_err(|e| e.desc().to_owned())?;
    if stat.st_mode & nix::libc::S_IFMT != nix::libc::S_IFREG {
        return Err("not a claim file".to_owned());
    }
    nix::fcntl::fcntl(
        borrowed,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(|e| e.desc().to_owned())?;
    // Held already (the lock is the open file's), or taken now; not by
    // `Flock`, which would unlock it when dropped.
    #[allow(deprecated)]
    nix::fcntl::flock(
        borrowed.as_raw_fd(),
        nix::fcntl::FlockArg::LockExclusiveNonblock,
    )
    .map_err(|_| "held by another process".to_owned())?;
    // SAFETY: an open regular file this process inherited, owned by
    // nothing else in it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_launcher_keeps_the_claims_its_kcm_handed_it_from_its_tasks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpu-0");
        let file = std::fs::File::create(&path).unwrap();
        let fd = OwnedFd::from(file);
        let number = fd.as_raw_fd();
        std::mem::forget(fd);
        let given = GpuSource::Given {
            devices: vec!["0".into()],
            claims: vec![number],
        };
        let held = acquire(&given, 1).unwrap();
        assert_eq!(held.devices, ["0"]);
        let flags = nix::fcntl::fcntl(
            held._claims[0].try_clone().unwrap(),
            nix::fcntl::FcntlArg::F_GETFD,
        )
        .unwrap();
        assert_ne!(flags & nix::libc::FD_CLOEXEC, 0, "no task inherits it");
        let other = std::fs::File::open(&path).unwrap();
        #[allow(deprecated)]
        let taken = nix::fcntl::flock(
            other.as_raw_fd(),
            nix::fcntl::FlockArg::LockExclusiveNonblock,
        );
        assert!(taken.is_err(), "held while the launcher lives");
        drop(held);
        #[allow(deprecated)]
        let taken = nix::fcntl::flock(
            other.as_raw_fd(),
            nix::fcntl::FlockArg::LockExclusiveNonblock,
        );
        assert!(taken.is_ok(), "gone with it");
        let none = GpuSource::Given {
            devices: vec!["0".into()],
            claims: vec![1],
        };
        assert!(
            acquire(&none, 1)
                .unwrap_err()
                .reason
                .contains("not a claim")
        );
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
