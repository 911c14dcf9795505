//! Maps and lists of a manifest counted as they are read: a crafted
//! submission of millions of tiny entries (a one-byte name in an
//! environment, an empty table) would otherwise make the runner hold tens
//! of bytes for each byte sent before validation could refuse it. Past its
//! bound, decoding fails with the field named.

use std::{fmt, marker::PhantomData};

use indexmap::IndexMap;
use serde::{
    Deserialize, Deserializer,
    de::{self, MapAccess, SeqAccess, Visitor},
};

/// The most variables a job's `env` holds.
pub const MAX_ENV_VARS: usize = 4096;
/// The most parameters a sweep names.
pub const MAX_PARAMS: usize = 256;
/// The most data files a sweep reads.
pub const MAX_TABLES: usize = 16;
/// The most output patterns a job declares.
pub const MAX_OUTPUT_PATTERNS: usize = 1024;

/// Entries reserved up front, whatever a length prefix claims.
const RESERVED: usize = 64;

/// A map of at most `max` entries, named `what` in the error.
fn map<'de, D, V>(d: D, max: usize, what: &'static str) -> Result<IndexMap<String, V>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de>,
{
    struct Bounded<V> {
        max: usize,
        what: &'static str,
        values: PhantomData<V>,
    }
    impl<'de, V: Deserialize<'de>> Visitor<'de> for Bounded<V> {
        type Value = IndexMap<String, V>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a table of at most {} {}", self.max, self.what)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<Self::Value, A::Error> {
            let hint = entries.size_hint().unwrap_or(0);
            let mut map = IndexMap::with_capacity(hint.min(self.max).min(RESERVED));
            while let Some((name, value)) = entries.next_entry::<String, V>()? {
                if map.len() == self.max && !map.contains_key(&name) {
                    return Err(de::Error::custom(format!(
                        "more than {} {}",
                        self.max, self.what
                    )));
                }
                map.insert(name, value);
            }
            Ok(map)
        }
    }
    d.deserialize_map(Bounded {
        max,
        what,
        values: PhantomData,
    })
}

/// A list of at most `max` items, named `what` in the error.
fn list<'de, D, T>(d: D, max: usize, what: &'static str) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Bounded<T> {
        max: usize,
        what: &'static str,
        items: PhantomData<T>,
    }
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Bounded<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a list of at most {} {}", self.max, self.what)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Self::Value, A::Error> {
            let hint = items.size_hint().unwrap_or(0);
            let mut list = Vec::with_capacity(hint.min(self.max).min(RESERVED));
            while let Some(item) = items.next_element()? {
                if list.len() == self.max {
                    return Err(de::Error::custom(format!(
                        "more than {} {}",
                        self.max, self.what
                    )));
                }
                list.push(item);
            }
            Ok(list)
        }
    }
    d.deserialize_seq(Bounded {
        max,
        what,
        items: PhantomData,
    })
}

pub(crate) fn env<'de, D: Deserializer<'de>>(d: D) -> Result<IndexMap<String, String>, D::Error> {
    map(d, MAX_ENV_VARS, "variables")
}

pub(crate) fn params<'de, D, V>(d: D) -> Result<IndexMap<String, V>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de>,
{
    map(d, MAX_PARAMS, "parameters")
}

pub(crate) fn tables<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    list(d, MAX_TABLES, "data files")
}

pub(crate) fn outputs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    list(d, MAX_OUTPUT_PATTERNS, "output patterns")
}

pub(crate) fn inputs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    list(d, crate::spec::MAX_INPUTS, "input files")
}

pub(crate) fn components<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    list(d, crate::spec::MAX_COMPONENTS, "components")
}

#[cfg(test)]
mod tests {
    use crate::Manifest;

    /// A MessagePack map claiming `claimed` entries, of `n` short names
    /// to empty strings.
    fn tiny_map(claimed: u32, n: usize) -> Vec<u8> {
        let mut body = vec![0xdf];
        body.extend_from_slice(&claimed.to_be_bytes());
        for i in 0..n {
            let name = format!("v{i}");
            body.push(0xa0 | u8::try_from(name.len()).unwrap());
            body.extend_from_slice(name.as_bytes());
            body.push(0xa0);
        }
        body
    }

    fn manifest_with(field: &str, value: &[u8]) -> Vec<u8> {
        let mut body = vec![0x83, 0xa4];
        body.extend_from_slice(b"name");
        body.extend_from_slice(&[0xa1, b'x', 0xa4]);
        body.extend_from_slice(b"task");
        body.extend_from_slice(&[0x91, 0x81, 0xa7]);
        body.extend_from_slice(b"command");
        body.extend_from_slice(&[0xa4]);
        body.extend_from_slice(b"true");
        body.push(0xa0 | u8::try_from(field.len()).unwrap());
        body.extend_from_slice(field.as_bytes());
        body.extend_from_slice(value);
        body
    }

    #[test]
    fn an_environment_of_millions_of_tiny_variables_is_refused_while_it_is_read() {
        let few = manifest_with("env", &tiny_map(10, 10));
        let read: Manifest = rmp_serde::from_slice(&few).expect("ten variables");
        assert_eq!(read.env.len(), 10);
        let many = manifest_with("env", &tiny_map(u32::MAX, 5000));
        let err = rmp_serde::from_slice::<Manifest>(&many).unwrap_err();
        assert!(
            err.to_string().contains("more than 4096 variables"),
            "{err}"
        );
    }

    #[test]
    fn long_lists_of_files_and_patterns_are_refused_while_they_are_read() {
        let mut patterns = vec![0xdd];
        patterns.extend_from_slice(&2000u32.to_be_bytes());
        patterns.extend(std::iter::repeat_n(0xa0, 2000));
        let err =
            rmp_serde::from_slice::<Manifest>(&manifest_with("outputs", &patterns)).unwrap_err();
        assert!(
            err.to_string().contains("more than 1024 output patterns"),
            "{err}"
        );
    }
}
