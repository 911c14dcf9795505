//! Sweep parameters: an explicit list of values, or an integer range.

use std::{fmt, sync::Arc};

use serde::{
    Deserialize, Deserializer, Serialize, Serializer,
    de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor},
    ser::SerializeMap,
};

use crate::compact::{Packed, TooLarge};

/// One value a parameter takes, substituted into the command as text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ParamValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
}

impl fmt::Display for ParamValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bool(b) => write!(f, "{b}"),
            Self::Int(i) => write!(f, "{i}"),
            // Debug keeps "1.0" as written instead of Display's "1".
            Self::Float(x) => write!(f, "{x:?}"),
            Self::Text(s) => f.write_str(s),
        }
    }
}

/// The values of one parameter: `[16, 32]` or `{ from = 1, to = 1000, step = 1 }`.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamSpec {
    List(ParamList),
    Range { from: i64, to: i64, step: i64 },
}

impl ParamSpec {
    /// How many values the parameter takes; `None` when the range is malformed.
    pub(crate) fn len(&self) -> Option<u64> {
        match self {
            Self::List(values) => Some(values.len() as u64),
            Self::Range { from, to, step } if *step > 0 && to >= from => {
                let span = i128::from(*to) - i128::from(*from);
                u64::try_from(span / i128::from(*step) + 1).ok()
            }
            Self::Range { .. } => None,
        }
    }

    /// The `i`th value; `i` must be below `len()`.
    pub(crate) fn value(&self, i: u64) -> ParamValue {
        match self {
            Self::List(values) => values.value(i as usize),
            // Within `from..=to`, so exact however the product wraps.
            Self::Range { from, step, .. } => {
                ParamValue::Int(from.wrapping_add(step.wrapping_mul(i as i64)))
            }
        }
    }

    /// What it holds on the heap, for bounding what a submission costs.
    pub fn heap_bytes(&self) -> usize {
        match self {
            Self::List(values) => values.heap_bytes(),
            Self::Range { .. } => 0,
        }
    }
}

const FALSE: u8 = 0;
const TRUE: u8 = 1;
const INT: u8 = 2;
const FLOAT: u8 = 3;
const TEXT: u8 = 4;

/// A parameter's list of values, packed so that it holds at most 5 bytes
/// for each byte that carried it (MessagePack, JSON or TOML), plus 64 for
/// the list: a `Vec<ParamValue>` held 32 bytes for a one-byte item, and up
/// to twice that while growing. Each value is an entry of a `Packed`: a
/// boolean is its tag alone, an integer its shortest two's-complement
/// bytes, a float its 8 bytes, a text its UTF-8. Clones share the buffers.
#[derive(Clone, Default, PartialEq)]
pub struct ParamList(Arc<Packed>);

impl ParamList {
    /// A list of `values`; fails only past [`crate::MAX_PACKED_BYTES`].
    pub fn new(values: impl IntoIterator<Item = ParamValue>) -> Result<Self, TooLarge> {
        let mut packed = Packed::default();
        for value in values {
            push(&mut packed, &value)?;
        }
        packed.shrink();
        Ok(Self(Arc::new(packed)))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`th value; `i` must be below `len()`.
    pub fn value(&self, i: usize) -> ParamValue {
        let (tag, bytes) = self.0.get(i);
        match tag {
            FALSE => ParamValue::Bool(false),
            TRUE => ParamValue::Bool(true),
            INT => ParamValue::Int(int_from(bytes)),
            FLOAT => ParamValue::Float(f64::from_le_bytes(bytes.try_into().unwrap_or_default())),
            _ => ParamValue::Text(String::from_utf8_lossy(bytes).into_owned()),
        }
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = ParamValue> + '_ {
        (0..self.len()).map(|i| self.value(i))
    }

    /// What it holds on the heap: its buffers and the block that shares them.
    pub fn heap_bytes(&self) -> usize {
        // The shared block: two counts and the buffers' pointers.
        2 * size_of::<usize>() + size_of::<Packed>() + self.0.heap_bytes()
    }
}

impl fmt::Debug for ParamList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

fn push(packed: &mut Packed, value: &ParamValue) -> Result<(), TooLarge> {
    match value {
        ParamValue::Bool(b) => packed.push(if *b { TRUE } else { FALSE }, &[]),
        ParamValue::Int(i) => {
            let (bytes, n) = int_bytes(*i);
            packed.push(INT, &bytes[..n])
        }
        ParamValue::Float(x) => packed.push(FLOAT, &x.to_le_bytes()),
        ParamValue::Text(s) => packed.push(TEXT, s.as_bytes()),
    }
}

/// `i`'s little-endian bytes, as few as give it back sign-extended: 0 takes
/// none, -128..=127 one.
fn int_bytes(i: i64) -> ([u8; 8], usize) {
    let bytes = i.to_le_bytes();
    let n = (0..=8).find(|&n| int_from(&bytes[..n]) == i).unwrap_or(8);
    (bytes, n)
}

fn int_from(bytes: &[u8]) -> i64 {
    let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
    let mut full = if negative { [0xff; 8] } else { [0; 8] };
    let n = bytes.len().min(8);
    full[..n].copy_from_slice(&bytes[..n]);
    i64::from_le_bytes(full)
}

impl Serialize for ParamSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::List(values) => s.collect_seq(values.iter()),
            Self::Range { from, to, step } => {
                let mut map = s.serialize_map(Some(3))?;
                map.serialize_entry("from", from)?;
                map.serialize_entry("to", to)?;
                map.serialize_entry("step", step)?;
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for ParamSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ParamSpecVisitor)
    }
}

struct ParamSpecVisitor;

impl<'de> Visitor<'de> for ParamSpecVisitor {
    type Value = ParamSpec;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of values like [16, 32] or a range like { from = 1, to = 100 }")
    }

    /// Appends each value to the buffers as it is read: nothing is
    /// allocated for one value.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ParamSpec, A::Error> {
        let mut packed = Packed::with_hint(seq.size_hint());
        while seq.next_element_seed(Element(&mut packed))?.is_some() {}
        packed.shrink();
        Ok(ParamSpec::List(ParamList(Arc::new(packed))))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ParamSpec, A::Error> {
        let (mut from, mut to, mut step) = (None, None, None);
        while let Some(key) = map.next_key::<String>()? {
            let slot = match key.as_str() {
                "from" => &mut from,
                "to" => &mut to,
                "step" => &mut step,
                other => {
                    return Err(de::Error::unknown_field(other, &["from", "to", "step"]));
                }
            };
            *slot = Some(map.next_value::<i64>()?);
        }
        Ok(ParamSpec::Range {
            from: from.ok_or_else(|| de::Error::missing_field("from"))?,
            to: to.ok_or_else(|| de::Error::missing_field("to"))?,
            step: step.unwrap_or(1),
        })
    }
}

/// One value of a list, appended where it is read. It takes what
/// `ParamValue` (untagged) takes: a boolean, an integer (one past `i64`
/// becomes a float), a float, or text (UTF-8 bytes included).
struct Element<'a>(&'a mut Packed);

impl Element<'_> {
    fn push<E: de::Error>(self, value: &ParamValue) -> Result<(), E> {
        push(self.0, value).map_err(E::custom)
    }
}

impl<'de> DeserializeSeed<'de> for Element<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Element<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a boolean, a number or a string")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.push(&ParamValue::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.push(&ParamValue::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.push(&i64::try_from(v).map_or(ParamValue::Float(v as f64), ParamValue::Int))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.push(&ParamValue::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.0.push(TEXT, v.as_bytes()).map_err(E::custom)
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<(), E> {
        match std::str::from_utf8(v) {
            Ok(text) => self.visit_str(text),
            Err(_) => Err(E::invalid_value(de::Unexpected::Bytes(v), &self)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> Vec<ParamValue> {
        use ParamValue::*;
        vec![
            Bool(true),
            Bool(false),
            Int(0),
            Int(1),
            Int(-1),
            Int(127),
            Int(128),
            Int(-128),
            Int(-129),
            Int(i64::MIN),
            Int(i64::MAX),
            Float(1.0),
            Float(0.1),
            Float(-0.0),
            Float(1e300),
            Text(String::new()),
            Text("a".into()),
            Text("é, \"x\"".into()),
            Text("1".into()),
        ]
    }

    fn list() -> ParamSpec {
        ParamSpec::List(ParamList::new(values()).unwrap())
    }

    #[test]
    fn a_list_gives_back_its_values_as_they_were() {
        let ParamSpec::List(list) = list() else {
            unreachable!()
        };
        assert_eq!(list.iter().collect::<Vec<_>>(), values());
        let shown: Vec<String> = list.iter().map(|v| v.to_string()).collect();
        assert_eq!(shown[11..15], ["1.0", "0.1", "-0.0", "1e300"]);
        assert_eq!(shown[9], "-9223372036854775808");
        assert_eq!(int_bytes(0).1, 0);
        assert_eq!(int_bytes(127).1, 1);
        assert_eq!(int_bytes(128).1, 2);
        assert_eq!(int_bytes(-128).1, 1);
        assert_eq!(int_bytes(i64::MIN).1, 8);
    }

    #[test]
    fn a_list_is_written_and_read_as_a_list_of_values_was() {
        let spec = list();
        let old = values();

        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(json, serde_json::to_string(&old).unwrap());
        assert_eq!(serde_json::from_str::<ParamSpec>(&json).unwrap(), spec);

        let packed = rmp_serde::to_vec_named(&spec).unwrap();
        assert_eq!(packed, rmp_serde::to_vec_named(&old).unwrap());
        assert_eq!(rmp_serde::from_slice::<ParamSpec>(&packed).unwrap(), spec);

        #[derive(Serialize, Deserialize)]
        struct Doc<T> {
            x: T,
        }
        let toml = toml::to_string(&Doc { x: &spec }).unwrap();
        assert_eq!(toml, toml::to_string(&Doc { x: &old }).unwrap());
        assert_eq!(toml::from_str::<Doc<ParamSpec>>(&toml).unwrap().x, spec);
    }

    #[test]
    fn a_list_reads_what_untagged_values_read() {
        // One past i64 is a float; a string sent as bytes is text.
        let big = u64::MAX;
        let spec: ParamSpec = serde_json::from_str(&format!("[{big}]")).unwrap();
        assert_eq!(spec.value(0), ParamValue::Float(big as f64));
        let bytes = rmp_serde::to_vec(&(serde_bytes::Bytes::new(b"ab"),)).unwrap();
        let spec: ParamSpec = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(spec.value(0), ParamValue::Text("ab".into()));
        for bad in ["[null]", "[[1]]", "[{}]"] {
            assert!(serde_json::from_str::<ParamSpec>(bad).is_err(), "{bad}");
        }
        let bytes = rmp_serde::to_vec(&(serde_bytes::Bytes::new(b"\xff"),)).unwrap();
        assert!(rmp_serde::from_slice::<ParamSpec>(&bytes).is_err());
    }
}
