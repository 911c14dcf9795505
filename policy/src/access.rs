//! Who may do what. A user is a broker account: the broker checks the
//! `user_id` of every message against the connection's user, so the name
//! on a submission or a request can be trusted. This module decides what
//! that name may do; RabbitMQ's permissions (`deploy/rabbitmq/user.sh`)
//! decide which queues it reaches at all.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

/// `[users]` of the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Users {
    /// One user, or a group that trusts each other: a submission needs no
    /// `user_id`, everyone sees and cancels every job, tasks run as the
    /// kcm's account and results go straight under `results_root`. Unset,
    /// it is off, but for `gleaner up`.
    pub single: Option<bool>,
    /// Broker users who see and cancel every job.
    pub admins: Vec<String>,
    /// Broker user → Unix account, where the two names differ.
    pub accounts: BTreeMap<String, String>,
}

/// Where a user's results go under `results_root`: in the directory of
/// their Unix `account` when users are kept apart, straight under it when
/// there is one user. The runner writes there and the CLI looks there;
/// this is the one place that says so.
pub fn results_area(results_root: &Path, account: Option<&str>) -> PathBuf {
    match account {
        Some(account) => results_root.join(account),
        None => results_root.to_owned(),
    }
}

/// Why a sender may not own a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerError {
    /// Many users, and the message says nobody's.
    Anonymous,
    /// A name that cannot be a word of a routing key or a directory.
    BadName(String),
    /// Root, or a broker user mapped to it.
    Root(String),
    /// Many users, and a service that does not run as root, so that it
    /// cannot act as each owner's account nor keep their results apart.
    NotRoot,
}

impl std::fmt::Display for OwnerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Anonymous => write!(
                f,
                "the submission has no user_id: on a gleaner of many users every manifest must name its sender (`gleaner submit` does; by hand, set the user_id property)"
            ),
            Self::BadName(name) => write!(
                f,
                "user {name:?} cannot own jobs: names are letters, digits, '_', '-' and '@', at most 64 (no '.': a job's events are routed by its owner's name)"
            ),
            Self::Root(name) => write!(f, "user {name:?} maps to root, which never owns jobs"),
            Self::NotRoot => write!(
                f,
                "this runner does not run as root, so it cannot keep users' results apart (run it as root, or configure [users] single = true)"
            ),
        }
    }
}

impl Users {
    pub fn is_single(&self) -> bool {
        self.single.unwrap_or(false)
    }

    pub fn is_admin(&self, user: &str) -> bool {
        self.admins.iter().any(|admin| admin == user)
    }

    /// Where `user`'s results go under `results_root` ([`results_area`]).
    pub fn results_area(&self, results_root: &Path, user: &str) -> PathBuf {
        results_area(
            results_root,
            (!self.is_single()).then(|| self.account(user)),
        )
    }

    /// The Unix account a broker user's tasks run as.
    pub fn account<'a>(&'a self, user: &'a str) -> &'a str {
        self.accounts.get(user).map_or(user, String::as_str)
    }

    /// The Unix account a job of `owner`'s runs as: none with one user
    /// (the service's own), else the owner's, which only a service
    /// running as root can act as.
    pub fn job_account<'a>(
        &'a self,
        owner: &'a str,
        runs_as_root: bool,
    ) -> Result<Option<&'a str>, OwnerError> {
        match (self.is_single(), runs_as_root) {
            (true, _) => Ok(None),
            (false, true) => Ok(Some(self.account(owner))),
            (false, false) => Err(OwnerError::NotRoot),
        }
    }

    /// Who owns a job sent by `sender` (the message's `user_id`). With one
    /// user, a manifest without `user_id` belongs to `fallback` (the
    /// runner's own broker user).
    pub fn owner(&self, sender: Option<&str>, fallback: &str) -> Result<String, OwnerError> {
        let owner = match sender {
            Some(user) => user,
            None if self.is_single() => fallback,
            None => return Err(OwnerError::Anonymous),
        };
        // With one user the name only has to be a name; with many it is a
        // word of routing keys and queue names that permissions rely on.
        if self.is_single() && !owner.is_empty() {
            return Ok(owner.to_owned());
        }
        let well_formed = !owner.is_empty()
            && owner.len() <= 64
            && owner
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '@'));
        if !well_formed {
            return Err(OwnerError::BadName(owner.to_owned()));
        }
        if !self.is_single() && self.account(owner) == "root" {
            return Err(OwnerError::Root(owner.to_owned()));
        }
        Ok(owner.to_owned())
    }

    /// Whether `user` (a request's `user_id`) may see the details of, and
    /// cancel, a job of `owner`.
    pub fn may_act_on(&self, user: Option<&str>, owner: &str) -> bool {
        if self.is_single() {
            return true;
        }
        user.is_some_and(|user| user == owner || self.is_admin(user))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn many() -> Users {
        Users {
            single: Some(false),
            admins: vec!["ops".into()],
            accounts: [("alice@lab".to_owned(), "alice".to_owned())].into(),
        }
    }

    #[test]
    fn many_users_need_a_sender() {
        let users = many();
        assert_eq!(users.owner(None, "gleaner"), Err(OwnerError::Anonymous));
        assert_eq!(users.owner(Some("bob"), "gleaner").unwrap(), "bob");
        assert_eq!(users.owner(Some("alice@lab"), "g").unwrap(), "alice@lab");
        let single = Users {
            single: Some(true),
            ..Users::default()
        };
        assert_eq!(single.owner(None, "guest").unwrap(), "guest");
        assert_eq!(single.owner(Some("alice"), "guest").unwrap(), "alice");
        assert!(!Users::default().is_single());
    }

    #[test]
    fn owners_are_plain_words_and_never_root() {
        let mut users = many();
        for bad in ["a.b", "", "../x", "x y", &"a".repeat(65)] {
            assert!(matches!(
                users.owner(Some(bad), "g"),
                Err(OwnerError::BadName(_))
            ));
        }
        assert_eq!(
            users.owner(Some("root"), "g"),
            Err(OwnerError::Root("root".into()))
        );
        users.accounts.insert("boss".into(), "root".into());
        assert!(matches!(
            users.owner(Some("boss"), "g"),
            Err(OwnerError::Root(_))
        ));
    }

    #[test]
    fn users_act_on_their_own_jobs_and_admins_on_all() {
        let users = many();
        assert!(users.may_act_on(Some("alice"), "alice"));
        assert!(!users.may_act_on(Some("bob"), "alice"));
        assert!(!users.may_act_on(None, "alice"));
        assert!(users.may_act_on(Some("ops"), "alice"));
        let single = Users {
            single: Some(true),
            ..Users::default()
        };
        assert!(single.may_act_on(None, "alice"));
        assert_eq!(many().account("alice@lab"), "alice");
        assert_eq!(many().account("bob"), "bob");
    }

    #[test]
    fn a_job_of_many_users_runs_as_its_owners_account_and_only_under_root() {
        let many = Users {
            single: Some(false),
            accounts: BTreeMap::from([("ann@lab".to_owned(), "ann".to_owned())]),
            ..Users::default()
        };
        assert_eq!(many.job_account("ann@lab", true), Ok(Some("ann")));
        assert_eq!(many.job_account("bob", true), Ok(Some("bob")));
        assert_eq!(many.job_account("bob", false), Err(OwnerError::NotRoot));
        let one = Users {
            single: Some(true),
            ..Users::default()
        };
        assert_eq!(one.job_account("bob", false), Ok(None));
    }
}
