//! GPU claims that only the launchers the kcm starts can hold (the local
//! backend). A launcher claiming its own devices by a name every process
//! of the host may take (an abstract socket) can be kept from them by any
//! user who takes the names first. Here a claim is a lock on a file in a
//! directory of the kcm's own account, mode 0700: the kcm takes the lock
//! and hands the open file to the launcher it starts, which inherits it
//! (and so the lock, which belongs to the open file) and holds it for its
//! life; the kernel drops it when the last holder dies, however it dies.
//! No other account can open the files, so none can take a claim.

use std::{
    ffi::OsStr,
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::{Path, PathBuf},
};

use gleaner_contain::shared::{Untrusted, open_private, private_dir};
use nix::{
    fcntl::{FlockArg, OFlag, openat},
    sys::stat::Mode,
    unistd::{Uid, getegid, geteuid},
};

/// The host's GPU claims: lock files named after the devices.
#[derive(Debug)]
pub struct GpuClaims {
    dir: OwnedFd,
    path: PathBuf,
}

/// One claimed device, held while its descriptor is open here or in the
/// launcher it was handed to.
#[derive(Debug)]
pub struct Claim {
    pub device: String,
    pub file: OwnedFd,
}

impl GpuClaims {
    /// The claims directory for this host: `/run/gleaner/gpus` for root
    /// (one per host, so that the kcms of several local clusters, and the
    /// launchers an earlier kcm left, claim from the same devices), and one
    /// in the temporary directory for any other account.
    pub fn for_host() -> Result<Self, Untrusted> {
        let me = geteuid();
        if me.is_root() {
            let root = (me, getegid());
            let run = private_dir(Path::new("/run"), "gleaner", root, me, 0o755)?;
            Self::open(&run, "gpus")
        } else {
            Self::open(&std::env::temp_dir(), &format!("gleaner-gpus-{me}"))
        }
    }

    /// The claims directory `name` in `base`, made if missing: this
    /// account's, and nobody else's to enter.
    pub fn open(base: &Path, name: &str) -> Result<Self, Untrusted> {
        let me: Uid = geteuid();
        let path = private_dir(base, name, (me, getegid()), me, 0o700)?;
        let dir = open_private(&path, me)?;
        Ok(Self { dir, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A claim on `device`, unless someone holds it (a launcher, or one an
    /// earlier kcm left).
    pub fn claim(&self, device: &str) -> Option<Claim> {
        let file = openat(
            self.dir.as_fd(),
            OsStr::new(&file_name(device)),
            OFlag::O_RDONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .ok()?;
        // Not `Flock`, which unlocks when dropped: the lock is the open
        // file's, shared with the launcher, and goes when both closed it.
        #[allow(deprecated)]
        nix::fcntl::flock(file.as_raw_fd(), FlockArg::LockExclusiveNonblock).ok()?;
        Some(Claim {
            device: device.to_owned(),
            file,
        })
    }

    /// `count` of `devices`, the first free ones; `None` if fewer are.
    pub fn claim_some(&self, devices: &[String], count: u32) -> Option<Vec<Claim>> {
        let wanted = count as usize;
        let claims: Vec<Claim> = devices
            .iter()
            .filter_map(|device| self.claim(device))
            .take(wanted)
            .collect();
        (claims.len() == wanted).then_some(claims)
    }
}

/// A device's lock file: its name with anything but `A-Z a-z 0-9 . _ -`
/// escaped, so that any name a cluster lists is one file of the directory.
fn file_name(device: &str) -> String {
    let mut name = "gpu-".to_owned();
    for byte in device.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-') {
            name.push(char::from(byte));
        } else {
            name.push_str(&format!("%{byte:02x}"));
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use std::os::unix::{fs::PermissionsExt, process::CommandExt};

    use super::*;

    #[test]
    fn a_claim_is_held_until_every_holder_closed_it() {
        let base = tempfile::tempdir().unwrap();
        let claims = GpuClaims::open(base.path(), "gpus").unwrap();
        let mode = std::fs::metadata(claims.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "nobody else's to enter");
        let devices: Vec<String> = ["0", "1"].map(String::from).into();
        let first = claims.claim_some(&devices, 1).unwrap();
        assert_eq!(first[0].device, "0");
        // As a launcher holds it: the same open file, in another descriptor.
        let inherited = first[0].file.try_clone().unwrap();
        drop(first);
        assert!(claims.claim("0").is_none(), "the launcher's still");
        assert_eq!(claims.claim_some(&devices, 1).unwrap()[0].device, "1");
        assert!(claims.claim_some(&devices, 2).is_none(), "one is free");
        drop(inherited);
        assert!(claims.claim("0").is_some(), "gone with its last holder");
    }

    #[test]
    fn no_other_account_can_take_a_claim() {
        if !geteuid().is_root() {
            return;
        }
        let base = tempfile::tempdir().unwrap();
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let claims = GpuClaims::open(base.path(), "gpus").unwrap();
        drop(claims.claim("0"));
        let file = claims.path().join(file_name("0"));
        // Bob, with the `flock` a launcher would take, outside gleaner.
        let bob = std::process::Command::new("/bin/sh")
            .args(["-c", "exec 9<\"$1\" && flock -n 9", "sh"])
            .arg(&file)
            .uid(65534)
            .gid(65534)
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(!bob.success(), "cannot even open it");
        assert!(claims.claim("0").is_some());
    }

    #[test]
    fn any_device_name_is_one_file() {
        assert_eq!(file_name("GPU-1;x"), "gpu-GPU-1%3bx");
        assert_eq!(file_name("../0"), "gpu-..%2f0");
        assert_eq!(file_name(""), "gpu-");
    }
}
