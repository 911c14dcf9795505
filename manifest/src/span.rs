//! One reading of number ranges, wherever they are written: task sets
//! (`3,7-12`), `submit --array` (`0-990:10`) and Grid Engine's array task
//! ids (`2-8:2,10`).

use std::str::FromStr;

/// `FIRST`, `FIRST-LAST` or `FIRST-LAST:STEP`: every `STEP`th number
/// from `FIRST` up to `LAST`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub first: u64,
    pub last: u64,
    pub step: u64,
}

impl Span {
    /// Each part of a comma-separated list, blanks skipped.
    pub fn list(text: &str) -> impl Iterator<Item = Result<Span, String>> + '_ {
        text.split(',')
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .map(str::parse)
    }

    /// The numbers, in order.
    pub fn numbers(self) -> impl Iterator<Item = u64> {
        let Span { first, last, step } = self;
        let mut next = Some(first);
        std::iter::from_fn(move || {
            let current = next.filter(|n| *n <= last)?;
            next = current.checked_add(step);
            Some(current)
        })
    }
}

impl FromStr for Span {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "{text:?}: write a number, a range or a range with a step, like 3, 7-12 or 0-990:10"
            )
        };
        let number = |s: &str| s.trim().parse::<u64>().map_err(|_| bad());
        let (range, step) = match text.split_once(':') {
            Some((range, step)) => (range, number(step)?),
            None => (text, 1),
        };
        let (first, last) = match range.split_once('-') {
            Some((first, last)) => (number(first)?, number(last)?),
            None => (number(range)?, number(range)?),
        };
        if last < first {
            return Err(format!("{text:?}: a range goes from low to high"));
        }
        if step == 0 {
            return Err(format!("{text:?}: a step is 1 or more"));
        }
        Ok(Self { first, last, step })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers(text: &str) -> Vec<u64> {
        Span::list(text)
            .flat_map(|span| span.unwrap().numbers())
            .collect()
    }

    #[test]
    fn numbers_ranges_and_steps() {
        assert_eq!(numbers("9, 10"), [9, 10]);
        assert_eq!(numbers("2-8:3"), [2, 5, 8]);
        assert_eq!(numbers("7"), [7]);
        assert_eq!(numbers("1-3,,5"), [1, 2, 3, 5]);
        let top = u64::MAX - 7;
        assert_eq!(numbers(&format!("{top}-{}:5", u64::MAX)), [top, top + 5]);
    }

    #[test]
    fn bad_parts_are_refused() {
        for text in ["a", "3-", "5-2", "-1", "1-2-3", "1-4:0", "1-4:x", ":2"] {
            assert!(text.parse::<Span>().is_err(), "{text:?} was accepted");
        }
    }
}
