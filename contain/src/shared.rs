//! Directories a program shares with other users: a scratch or checkpoint
//! base on a node's `/tmp`, the results root, the kcm's spool.
//!
//! Whoever may change a directory on the way to a path may swap what
//! follows for a link, between a check and its use. So a path is trusted
//! only if every directory on the way, opened one at a time without
//! following links, is owned by root or by this process's account and
//! nobody else may write to it, but for sticky directories (like `/tmp`):
//! there others may add entries of their own and change nothing else,
//! and the entry that follows is checked in turn. Such a chain stays
//! trusted: only root and this account can change it afterwards, so paths
//! beneath it may be used as paths.

use std::{
    ffi::OsStr,
    os::{
        fd::{AsFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Component, Path},
};

use nix::{
    errno::Errno,
    fcntl::{OFlag, open, openat},
    sys::stat::{FileStat, Mode, fchmod, fstat, mkdirat},
    unistd::{Gid, Uid, fchown},
};

/// Why a directory cannot be trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct Untrusted {
    pub path: String,
    pub reason: String,
}

fn untrusted(path: &Path, reason: impl Into<String>) -> Untrusted {
    Untrusted {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

/// Opens the directory `path` (made absolute against the working
/// directory) and checks the way to it as the module says, trusting root
/// and `me`. A link anywhere on the way, `..`, or a directory of someone
/// else's is refused with the part that is.
pub fn open_trusted(path: &Path, me: Uid) -> Result<OwnedFd, Untrusted> {
    let absolute = std::path::absolute(path).map_err(|e| untrusted(path, e.to_string()))?;
    let mut walked = std::path::PathBuf::from("/");
    let mut dir = open(
        "/",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| untrusted(&walked, e.desc()))?;
    check(&dir, &walked, me)?;
    for part in absolute.components() {
        let name = match part {
            Component::RootDir | Component::CurDir => continue,
            Component::Normal(name) => name,
            Component::ParentDir | Component::Prefix(_) => {
                return Err(untrusted(path, "`..` on the way is not followed"));
            }
        };
        walked.push(name);
        dir = open_below(&dir, name).map_err(|e| untrusted(&walked, e))?;
        check(&dir, &walked, me)?;
    }
    Ok(dir)
}

/// [`open_trusted`], for a directory whose own entries nobody else may
/// change either (not even sticky): where a root program writes files
/// and reads them back.
pub fn open_private(path: &Path, me: Uid) -> Result<OwnedFd, Untrusted> {
    let dir = open_trusted(path, me)?;
    let stat = fstat(dir.as_fd()).map_err(|e| untrusted(path, e.desc()))?;
    if stat.st_mode & 0o022 != 0 {
        return Err(untrusted(path, "others may write to it (chmod go-w)"));
    }
    Ok(dir)
}

/// Opens the directory `name` in `dir`, not following a link.
fn open_below(dir: &OwnedFd, name: &OsStr) -> Result<OwnedFd, String> {
    openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::ELOOP | Errno::ENOTDIR => "a link or not a directory".to_owned(),
        e => e.desc().to_owned(),
    })
}

/// Whether a directory on the way may be trusted.
fn check(dir: &OwnedFd, path: &Path, me: Uid) -> Result<FileStat, Untrusted> {
    let stat = fstat(dir.as_fd()).map_err(|e| untrusted(path, e.desc()))?;
    let owner = Uid::from_raw(stat.st_uid);
    if !owner.is_root() && owner != me {
        return Err(untrusted(
            path,
            format!(
                "owned by uid {}, who could swap what is in it for a link (make it root's)",
                stat.st_uid
            ),
        ));
    }
    let sticky = stat.st_mode & 0o1000 != 0;
    if stat.st_mode & 0o022 != 0 && !sticky {
        return Err(untrusted(
            path,
            "others may write to it and it is not sticky (chmod o-w, or +t)",
        ));
    }
    Ok(stat)
}

/// Makes a directory `name` in `base`, `owner`'s, of mode `mode` (made
/// so, or found so: a directory of someone else's, a link, or one others
/// may write to in its place is refused), on a way trusted as the module
/// says (root's and `me`'s, the process's own account). Made by `mkdirat`
/// and handed over through a descriptor that did not follow a link, so
/// nothing swapped in meanwhile is what gets the owner.
pub fn private_dir(
    base: &Path,
    name: &str,
    owner: (Uid, Gid),
    me: Uid,
    mode: u32,
) -> Result<std::path::PathBuf, Untrusted> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(untrusted(base, format!("{name:?} is not a directory name")));
    }
    let base_dir = open_trusted(base, me)?;
    let path = base.join(name);
    match mkdirat(base_dir.as_fd(), name, Mode::from_bits_truncate(mode)) {
        Ok(()) => {
            let made = open_below(&base_dir, OsStr::from_bytes(name.as_bytes()))
                .map_err(|e| untrusted(&path, e))?;
            // Ours since we made it, opened without following a link: its
            // ownership and mode are set on what was made, whatever is
            // done to the name meanwhile.
            if owner.0 != nix::unistd::geteuid() {
                fchown(made.as_fd(), Some(owner.0), Some(owner.1))
                    .map_err(|e| untrusted(&path, e.desc()))?;
            }
            fchmod(made.as_fd(), Mode::from_bits_truncate(mode))
                .map_err(|e| untrusted(&path, e.desc()))?;
        }
        Err(Errno::EEXIST) => {}
        Err(e) => return Err(untrusted(&path, e.desc())),
    }
    let dir = open_below(&base_dir, OsStr::from_bytes(name.as_bytes()))
        .map_err(|e| untrusted(&path, e))?;
    let stat = fstat(dir.as_fd()).map_err(|e| untrusted(&path, e.desc()))?;
    if stat.st_uid != owner.0.as_raw() || stat.st_mode & 0o022 != 0 {
        return Err(untrusted(
            &path,
            format!(
                "not a directory of uid {}'s that only it may write to (someone else's, or writable by others)",
                owner.0
            ),
        ));
    }
    Ok(path)
}

/// What [`root_base`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    /// It was root's, shared like `/tmp`, already.
    Kept,
    /// It was missing, and is made.
    Made,
    /// It was someone else's (or not sticky), and is root's now.
    Repaired,
}

/// Makes `base`, a base of per-user directories on this host, root's and
/// shared like `/tmp` (mode 1777), as root: a base that an account made
/// could be used by that account against every other one. The way to it
/// must be trusted already.
pub fn root_base(base: &Path) -> Result<Base, Untrusted> {
    let root = Uid::from_raw(0);
    let (Some(parent), Some(name)) = (base.parent(), base.file_name()) else {
        return Err(untrusted(base, "not a directory in a directory"));
    };
    let parent_dir = open_trusted(parent, root)?;
    let made = match mkdirat(parent_dir.as_fd(), name, Mode::from_bits_truncate(0o755)) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(e) => return Err(untrusted(base, e.desc())),
    };
    let dir = open_below(&parent_dir, name).map_err(|e| untrusted(base, e))?;
    let stat = fstat(dir.as_fd()).map_err(|e| untrusted(base, e.desc()))?;
    if !made && stat.st_uid == 0 && stat.st_mode & 0o7777 == 0o1777 {
        return Ok(Base::Kept);
    }
    fchown(dir.as_fd(), Some(root), Some(Gid::from_raw(0)))
        .map_err(|e| untrusted(base, e.desc()))?;
    fchmod(dir.as_fd(), Mode::from_bits_truncate(0o1777)).map_err(|e| untrusted(base, e.desc()))?;
    Ok(if made { Base::Made } else { Base::Repaired })
}

/// Makes `base`, if it is missing, a base of per-user directories shared
/// like `/tmp` (mode 1777, this account's, since this account made it), in
/// a parent trusted as the module says: made by `mkdirat` and its mode set
/// through a descriptor that did not follow a link, so that a link
/// planted or swapped in meanwhile gets nothing. A base of someone else's
/// found there is refused by [`private_dir`].
pub fn shared_base(base: &Path, me: Uid) -> Result<(), Untrusted> {
    let (Some(parent), Some(name)) = (base.parent(), base.file_name()) else {
        return Err(untrusted(base, "not a directory in a directory"));
    };
    let parent_dir = open_trusted(parent, me)?;
    match mkdirat(parent_dir.as_fd(), name, Mode::from_bits_truncate(0o700)) {
        Ok(()) => {
            let made = open_below(&parent_dir, name).map_err(|e| untrusted(base, e))?;
            fchmod(made.as_fd(), Mode::from_bits_truncate(0o1777))
                .map_err(|e| untrusted(base, e.desc()))
        }
        Err(Errno::EEXIST) => Ok(()),
        Err(e) => Err(untrusted(base, e.desc())),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    fn me() -> (Uid, Gid) {
        (nix::unistd::geteuid(), nix::unistd::getegid())
    }

    #[test]
    fn a_private_directory_is_made_once_and_found_again() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("scratch");
        shared_base(&base, me().0).unwrap();
        std::fs::remove_dir(&base).unwrap();
        std::os::unix::fs::symlink(root.path().join("elsewhere"), &base).unwrap();
        std::fs::create_dir(root.path().join("elsewhere")).unwrap();
        shared_base(&base, me().0).unwrap();
        assert_eq!(
            std::fs::metadata(root.path().join("elsewhere"))
                .unwrap()
                .mode()
                & 0o7777,
            0o755,
            "a link in its place gets no mode"
        );
        std::fs::remove_file(&base).unwrap();
        shared_base(&base, me().0).unwrap();
        let dir = private_dir(&base, "1000", me(), me().0, 0o700).unwrap();
        assert_eq!(dir, base.join("1000"));
        let meta = std::fs::metadata(&dir).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o700);
        assert_eq!(std::fs::metadata(&base).unwrap().mode() & 0o7777, 0o1777);
        assert_eq!(private_dir(&base, "1000", me(), me().0, 0o700), Ok(dir));
    }

    #[test]
    fn links_and_open_directories_on_the_way_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("scratch");
        std::fs::create_dir(&base).unwrap();
        std::fs::create_dir(root.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(root.path().join("elsewhere"), base.join("1000")).unwrap();
        let err = private_dir(&base, "1000", me(), me().0, 0o700).unwrap_err();
        assert!(err.reason.contains("a link"), "{err}");
        std::os::unix::fs::symlink(&base, root.path().join("via")).unwrap();
        let err = open_trusted(&root.path().join("via"), me().0).unwrap_err();
        assert!(err.reason.contains("a link"), "{err}");
        let open = root.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = open_trusted(&open.join("."), me().0).unwrap_err();
        assert!(err.reason.contains("not sticky"), "{err}");
        assert!(open_trusted(&root.path().join("x/../scratch"), me().0).is_err());
    }

    #[test]
    fn a_base_of_someone_elses_becomes_roots() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("scratch");
        assert_eq!(root_base(&base), Ok(Base::Made));
        assert_eq!(root_base(&base), Ok(Base::Kept));
        std::os::unix::fs::chown(&base, Some(54_321), None).unwrap();
        assert_eq!(root_base(&base), Ok(Base::Repaired));
        let meta = std::fs::metadata(&base).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o1777));
        std::fs::remove_dir(&base).unwrap();
        std::os::unix::fs::symlink("/etc", &base).unwrap();
        assert!(root_base(&base).is_err(), "a link is not followed");
    }

    #[test]
    fn a_directory_of_someone_elses_is_refused() {
        let root = tempfile::tempdir().unwrap();
        // As root, trust only a made-up account: root's directories are
        // still trusted, the test's own (root's too) as well, so pretend
        // to be another account by the uid asked for.
        let base = root.path().join("scratch");
        std::fs::create_dir(&base).unwrap();
        let someone = Uid::from_raw(54_321);
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&base, Some(someone.as_raw()), None).unwrap();
            let err = open_trusted(&base, Uid::from_raw(12_345)).unwrap_err();
            assert!(err.reason.contains("owned by uid 54321"), "{err}");
            std::os::unix::fs::chown(&base, Some(0), None).unwrap();
            std::fs::create_dir(base.join("1000")).unwrap();
            std::os::unix::fs::chown(base.join("1000"), Some(someone.as_raw()), None).unwrap();
            let err = private_dir(
                &base,
                "1000",
                (Uid::from_raw(1000), Gid::from_raw(1000)),
                Uid::from_raw(0),
                0o700,
            )
            .unwrap_err();
            assert!(err.reason.contains("not a directory of uid 1000"), "{err}");
        }
    }
}
