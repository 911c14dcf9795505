//! Sweep parameters: an explicit list of values, or an integer range.

use std::fmt;

use serde::{
    Deserialize, Deserializer, Serialize, Serializer,
    de::{self, MapAccess, SeqAccess, Visitor},
    ser::SerializeMap,
};

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
    List(Vec<ParamValue>),
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
            Self::List(values) => values[i as usize].clone(),
            // Within `from..=to`, so exact however the product wraps.
            Self::Range { from, step, .. } => {
                ParamValue::Int(from.wrapping_add(step.wrapping_mul(i as i64)))
            }
        }
    }
}

impl Serialize for ParamSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::List(values) => values.serialize(s),
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

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ParamSpec, A::Error> {
        let mut values = Vec::new();
        while let Some(value) = seq.next_element()? {
            values.push(value);
        }
        Ok(ParamSpec::List(values))
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
