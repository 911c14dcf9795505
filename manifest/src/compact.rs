//! Many short values in two buffers: their bytes end to end, and where each
//! ends. A `Vec<String>` costs 24 bytes a value before its text, so a list
//! of one-byte items held that way costs 30 times the bytes that carried it;
//! held here it costs at most 5 (4 for the end, 1 for the byte).

use std::fmt;

/// The most bytes one list or table holds: an entry keeps its end in 29 bits
/// (a message carries 16 MiB at most).
pub const MAX_PACKED_BYTES: usize = (1 << 29) - 1;

/// Entries reserved up front at most, whatever length the sender claims, so
/// that a claimed length costs nothing until its items arrive.
const MAX_RESERVE: usize = 1 << 14;

/// A list or table past [`MAX_PACKED_BYTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge;

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "more than {} MiB in one list or table",
            (MAX_PACKED_BYTES + 1) >> 20
        )
    }
}

impl std::error::Error for TooLarge {}

/// Byte strings end to end, each with a 3-bit tag: entry `i` is
/// `end << 3 | tag`, and its bytes start where entry `i - 1`'s end.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Packed {
    bytes: Vec<u8>,
    entries: Vec<u32>,
}

impl Packed {
    /// Room for `hint` entries of one byte, but never much.
    pub(crate) fn with_hint(hint: Option<usize>) -> Self {
        let n = hint.unwrap_or(0).min(MAX_RESERVE);
        Self {
            bytes: Vec::with_capacity(n),
            entries: Vec::with_capacity(n),
        }
    }

    pub(crate) fn push(&mut self, tag: u8, bytes: &[u8]) -> Result<(), TooLarge> {
        let end = self.bytes.len() + bytes.len();
        if end > MAX_PACKED_BYTES {
            return Err(TooLarge);
        }
        self.bytes.extend_from_slice(bytes);
        self.entries.push((end as u32) << 3 | u32::from(tag & 7));
        Ok(())
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Entry `i`'s tag and bytes; `i` must be below `len()`.
    pub(crate) fn get(&self, i: usize) -> (u8, &[u8]) {
        let entry = self.entries[i];
        let start = i
            .checked_sub(1)
            .map_or(0, |p| (self.entries[p] >> 3) as usize);
        ((entry & 7) as u8, &self.bytes[start..(entry >> 3) as usize])
    }

    /// Gives back what growing by doubling left unused.
    pub(crate) fn shrink(&mut self) {
        self.bytes.shrink_to_fit();
        self.entries.shrink_to_fit();
    }

    /// What its two buffers hold on the heap.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + self.entries.capacity() * size_of::<u32>()
    }
}

/// Reserves for a length claim, bounded like [`Packed::with_hint`].
pub(crate) fn cautious<T>(hint: Option<usize>) -> Vec<T> {
    Vec::with_capacity(hint.unwrap_or(0).min(MAX_RESERVE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_come_back_with_their_tags() {
        let mut p = Packed::with_hint(Some(usize::MAX));
        assert!(p.heap_bytes() <= 5 * MAX_RESERVE);
        p.push(1, b"ab").unwrap();
        p.push(2, b"").unwrap();
        p.push(7, "é".as_bytes()).unwrap();
        p.shrink();
        assert_eq!(p.len(), 3);
        assert_eq!(p.get(0), (1, &b"ab"[..]));
        assert_eq!(p.get(1), (2, &b""[..]));
        assert_eq!(p.get(2), (7, "é".as_bytes()));
        assert_eq!(p.heap_bytes(), 4 + 3 * 4);
    }
}
