//! The identifiers that travel in messages besides job ids: a cluster's
//! name, a launcher's id and a grow grant's id.
//!
//! Each is its own type because as bare strings and integers they were
//! mixed up (a launcher id where a cluster name belongs, a grant id next to
//! slot counts). On the wire they are exactly what they wrap
//! (`#[serde(transparent)]`), so older and newer components keep talking.

use std::{borrow::Borrow, fmt};

use serde::{Deserialize, Serialize};

/// A cluster's name, as its kcm calls it: it keys every per-cluster map and
/// names the kcm's queue, so it must not be confused with a launcher's id or
/// a host.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ClusterName(String);

/// A launcher's id (`<cluster>-<batch id>`, see
/// [`launcher_id`](crate::naming::launcher_id)): it names the launcher's
/// queue and is what a runner tells a kcm to remove, so it must not be
/// confused with the cluster it runs on. The default, empty, is no launcher
/// (a grid component's result).
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LauncherId(String);

/// A grow grant's id, issued by the scheduler and echoed back by the runner
/// and the kcm that act on it; its own type so that it cannot be taken for
/// the slot counts that travel with it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct GrantId(u64);

/// What the two string identifiers share.
macro_rules! string_id {
    ($name:ident) => {
        impl $name {
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> Self {
                Self(id)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                Self(id.to_owned())
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        /// As the string itself: lists of ids in logs read `["c1", "c2"]`.
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

string_id!(ClusterName);
string_id!(LauncherId);

impl GrantId {
    pub const fn new(id: u64) -> Self {
        Self(id)
    }

    /// The id issued after this one.
    #[must_use]
    pub const fn next(self) -> Self {
        Self(self.0.wrapping_add(1))
    }
}

impl From<u64> for GrantId {
    fn from(id: u64) -> Self {
        Self(id)
    }
}

impl fmt::Display for GrantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn maps_keyed_by_ids_are_looked_up_by_str() {
        let clusters: BTreeMap<ClusterName, u32> = [(ClusterName::from("c1"), 4)].into();
        assert_eq!(clusters.get("c1"), Some(&4));
        assert_eq!(clusters.get("c2"), None);
    }

    #[test]
    fn ids_display_as_what_they_wrap() {
        assert_eq!(ClusterName::from("c1").to_string(), "c1");
        assert_eq!(LauncherId::from("c1-4711.3").to_string(), "c1-4711.3");
        assert_eq!(GrantId::new(7).to_string(), "7");
        assert_eq!(GrantId::new(7).next(), GrantId::new(8));
    }
}
