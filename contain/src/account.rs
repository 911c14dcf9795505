//! Running as a job's owner: their Unix account, looked up once, and the
//! switch to it between fork and exec.

use nix::unistd::{Gid, Uid, User};

/// A job owner's Unix account, with everything the switch to it needs
/// looked up beforehand (between fork and exec nothing may be looked up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: Uid,
    pub gid: Gid,
    /// Supplementary groups, as `initgroups` would set them.
    pub groups: Vec<Gid>,
    pub home: std::path::PathBuf,
}

impl Account {
    /// The account named `name` on this host. Root never owns jobs.
    pub fn lookup(name: &str) -> Result<Self, String> {
        let user = User::from_name(name)
            .map_err(|e| format!("cannot look up Unix account {name:?}: {e}"))?
            .ok_or_else(|| format!("there is no Unix account {name:?} on this host"))?;
        if user.uid.is_root() {
            return Err(format!("{name:?} is root, which never owns jobs"));
        }
        let c_name = std::ffi::CString::new(name)
            .map_err(|_| format!("{name:?} cannot be an account name"))?;
        let groups = nix::unistd::getgrouplist(&c_name, user.gid)
            .map_err(|e| format!("cannot read the groups of {name:?}: {e}"))?;
        Ok(Self {
            name: name.to_owned(),
            uid: user.uid,
            gid: user.gid,
            groups,
            home: user.dir,
        })
    }

    /// What a login as this account would set in the environment.
    pub fn environment(&self) -> [(&'static str, std::ffi::OsString); 3] {
        [
            ("HOME", self.home.clone().into_os_string()),
            ("USER", self.name.clone().into()),
            ("LOGNAME", self.name.clone().into()),
        ]
    }

    /// Whether this process is already this account (nothing to switch).
    pub fn is_me(&self) -> bool {
        nix::unistd::geteuid() == self.uid
    }

    /// Becomes this account: groups, then group, then user, so that none
    /// of root's stays. Called between fork and exec: plain system calls
    /// on what [`Account::lookup`] found, no allocation.
    pub fn become_it(&self) -> std::io::Result<()> {
        nix::unistd::setgroups(&self.groups)?;
        nix::unistd::setgid(self.gid)?;
        nix::unistd::setuid(self.uid)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_never_owns_jobs() {
        assert!(Account::lookup("root").unwrap_err().contains("root"));
        assert!(
            Account::lookup("no-such-user-here")
                .unwrap_err()
                .contains("no Unix account")
        );
    }
}
