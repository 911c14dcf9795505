//! The identifiers that travel in messages besides job ids: a cluster's
//! name, a launcher's id and a grow grant's id.
//!
//! Each is its own type because as bare strings and integers they were
//! mixed up (a launcher id where a cluster name belongs, a grant id next to
//! slot counts). On the wire they are exactly what they wrap.
//!
//! The string ids name queues, batch jobs and log fields, and launchers
//! send them (a task can hold its launcher's account and send anything):
//! so they are checked where they are read, and a message with a name
//! that is too long or has other characters than `A-Z a-z 0-9 . _ -` does
//! not decode (it goes to `gleaner.dead` with the reason), rather than
//! make a queue name the broker cannot take. Host names that launchers
//! report are held to the same characters ([`host_name`]).

use std::{borrow::Borrow, fmt};

use serde::{Deserialize, Serialize};

/// A cluster's name, as its kcm calls it: it keys every per-cluster map and
/// names the kcm's queue, so it must not be confused with a launcher's id or
/// a host.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct ClusterName(String);

/// A launcher's id (`<cluster>-<batch id>`, see
/// [`launcher_id`](crate::naming::launcher_id)): it names the launcher's
/// queue and is what a runner tells a kcm to remove, so it must not be
/// confused with the cluster it runs on. The default, empty, is no launcher
/// (a grid component's result).
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
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

/// The longest cluster name: it names the kcm's queue and begins every
/// launcher id.
pub const MAX_CLUSTER_NAME: usize = 64;
/// The longest launcher id: `gleaner.launcher.<job>:<launcher>` stays
/// within the broker's 255 bytes for the longest job id (81).
pub const MAX_LAUNCHER_ID: usize = 150;
/// The longest host name (DNS's limit).
pub const MAX_HOST_NAME: usize = 253;

/// Whether `word` (empty or not) is at most `max` bytes of `A-Z a-z 0-9 .
/// _ -`: safe in a queue name, a batch job's name, a log line and a
/// terminal.
pub fn is_name(word: &str, max: usize) -> bool {
    word.len() <= max
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Deserializes a host name a launcher reports, checked as [`is_name`].
pub fn host_name<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let host = String::deserialize(deserializer)?;
    if is_name(&host, MAX_HOST_NAME) {
        Ok(host)
    } else {
        Err(serde::de::Error::custom(format!(
            "host {:?} is not a host name",
            shorten(&host)
        )))
    }
}

/// The most GPUs a launcher may say it found claimed on its host.
pub const MAX_HELD_GPUS: usize = 64;
/// The longest device name (`GPU-<uuid>` has 40 bytes).
pub const MAX_DEVICE_NAME: usize = 64;

/// Whether `device` may name a GPU in a message: at most
/// [`MAX_DEVICE_NAME`] printable bytes.
pub fn is_device_name(device: &str) -> bool {
    device.len() <= MAX_DEVICE_NAME && device.bytes().all(|b| b.is_ascii_graphic())
}

/// Deserializes the devices a launcher says it found claimed: at most
/// [`MAX_HELD_GPUS`] of at most [`MAX_DEVICE_NAME`] printable bytes, since
/// they go into log lines and cluster reports as a task may have written
/// them.
pub fn device_names<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<String>, D::Error> {
    let devices = Vec::<String>::deserialize(deserializer)?;
    if devices.len() <= MAX_HELD_GPUS && devices.iter().all(|d| is_device_name(d)) {
        Ok(devices)
    } else {
        Err(serde::de::Error::custom(
            "GPU devices: too many, or not printable names",
        ))
    }
}

/// The start of a refused name, for the reason that names it.
fn shorten(word: &str) -> String {
    word.chars().take(40).collect()
}

/// What the two string identifiers share.
macro_rules! string_id {
    ($name:ident, $max:expr, $what:literal) => {
        /// Checked as it is read: it came from outside.
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let id = String::deserialize(deserializer)?;
                if is_name(&id, $max) {
                    Ok(Self(id))
                } else {
                    Err(serde::de::Error::custom(format!(
                        "{:?} is not a {} (at most {} of A-Z a-z 0-9 . _ -)",
                        shorten(&id),
                        $what,
                        $max
                    )))
                }
            }
        }

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

string_id!(ClusterName, MAX_CLUSTER_NAME, "cluster name");
string_id!(LauncherId, MAX_LAUNCHER_ID, "launcher id");

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

    #[test]
    fn names_from_outside_are_checked_where_they_are_read() {
        let read = |json: &str| serde_json::from_str::<ClusterName>(json);
        assert_eq!(read("\"c1.a_b-2\"").unwrap().as_str(), "c1.a_b-2");
        let long = format!("\"{}\"", "c".repeat(300));
        for bad in [long.as_str(), "\"a b\"", "\"a\\nb\"", "\"gl\\u001b[2J\""] {
            let err = read(bad).unwrap_err().to_string();
            assert!(err.contains("not a cluster name"), "{err}");
        }
        let launcher = format!("\"c1-{}\"", "1".repeat(MAX_LAUNCHER_ID));
        assert!(serde_json::from_str::<LauncherId>(&launcher).is_err());
        assert!(serde_json::from_str::<LauncherId>("\"c1-4711.3\"").is_ok());
        #[derive(Deserialize)]
        struct Host(#[serde(deserialize_with = "host_name")] String);
        assert_eq!(
            serde_json::from_str::<Host>("\"node1.example\"").unwrap().0,
            "node1.example"
        );
        assert!(serde_json::from_str::<Host>("\"node1;rm\"").is_err());
    }

    #[test]
    fn held_gpus_are_few_printable_names() {
        #[derive(Deserialize)]
        struct Held(#[serde(deserialize_with = "device_names")] Vec<String>);
        let read = |json: &str| serde_json::from_str::<Held>(json).map(|h| h.0);
        assert_eq!(read(r#"["0","GPU-1;x"]"#).unwrap(), ["0", "GPU-1;x"]);
        assert!(read(r#"["0\u001b[2J"]"#).is_err());
        let many = format!("[{}]", vec!["\"0\""; MAX_HELD_GPUS + 1].join(","));
        assert!(read(&many).is_err());
    }
}
