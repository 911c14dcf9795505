//! Sweep rows from data files: a CSV file (its header names the
//! parameters, each row is a task) or a file of lines (each line a task, as
//! `{line}`). `gleaner submit` reads the files, relative to the manifest,
//! and sends their rows inside the manifest: the runner reads no user file.

use std::{fmt, sync::Arc};

use serde::{
    Deserialize, Deserializer, Serialize, Serializer,
    de::{self, DeserializeSeed, SeqAccess, Visitor},
};

use crate::{
    ManifestError,
    compact::{Packed, TooLarge, cautious},
};

/// The rows of one data file, as strings. Its rows are held packed, at
/// most 4 bytes for each byte that carried them plus 88 for the table, and
/// read without making a `String` a cell; they are written as a list of
/// lists of strings, as they always were.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table {
    /// The file, as the manifest names it (`sweep.csv` or `sweep.lines`).
    pub source: String,
    pub columns: Vec<String>,
    rows: Rows,
}

/// The parameter a file of lines gives each task.
pub const LINE: &str = "line";

/// At most this much data travels inside one manifest: a message holds
/// 16 MiB at most (`gleaner_protocol::MAX_MESSAGE_BYTES`), and a sweep
/// that large wants a range, or rows added to an open job in pieces.
pub const MAX_TABLE_BYTES: usize = 12 << 20;

impl Table {
    /// A CSV file: the first record names the columns, every other record
    /// is one task. Errors name the file and the line.
    pub fn from_csv(field: &str, source: &str, data: &[u8]) -> Result<Self, ManifestError> {
        check_size(field, source, data)?;
        let at = |line: Option<u64>, message: String| {
            let place = line.map_or_else(|| source.to_owned(), |l| format!("{source} line {l}"));
            ManifestError::invalid(field, format!("{place}: {message}"))
        };
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .from_reader(data);
        let header = reader
            .headers()
            .map_err(|e| at(e.position().map(csv::Position::line), csv_error(&e)))?
            .clone();
        let columns: Vec<String> = header.iter().map(|c| c.trim().to_owned()).collect();
        if columns.iter().all(String::is_empty) {
            return Err(at(
                Some(1),
                "the header (parameter names) is missing".into(),
            ));
        }
        for (i, column) in columns.iter().enumerate() {
            if !is_param_name(column) {
                return Err(at(
                    Some(1),
                    format!(
                        "column {} is named {column:?}: names are letters, digits and '_'",
                        i + 1
                    ),
                ));
            }
            if columns[..i].contains(column) {
                return Err(at(Some(1), format!("column {column:?} appears twice")));
            }
        }
        let mut rows = RowsBuilder::default();
        let mut record = csv::StringRecord::new();
        loop {
            match reader.read_record(&mut record) {
                Ok(true) => rows
                    .push_row(record.iter())
                    .map_err(|e| at(None, e.to_string()))?,
                Ok(false) => break,
                Err(e) => return Err(at(e.position().map(csv::Position::line), csv_error(&e))),
            }
        }
        let rows = rows.finish();
        if rows.is_empty() {
            return Err(at(None, "has a header but no rows".into()));
        }
        Ok(Self {
            source: source.to_owned(),
            columns,
            rows,
        })
    }

    /// A file of lines, one task per line; blank lines are skipped, and so
    /// are a `\r` before the newline and a byte-order mark.
    pub fn from_lines(field: &str, source: &str, data: &[u8]) -> Result<Self, ManifestError> {
        check_size(field, source, data)?;
        let text = std::str::from_utf8(data).map_err(|e| {
            let line = data[..e.valid_up_to()]
                .iter()
                .filter(|b| **b == b'\n')
                .count()
                + 1;
            ManifestError::invalid(field, format!("{source} line {line}: not UTF-8 text"))
        })?;
        let mut rows = RowsBuilder::default();
        for line in text
            .strip_prefix('\u{feff}')
            .unwrap_or(text)
            .lines()
            .filter(|line| !line.trim().is_empty())
        {
            rows.push_row([line])
                .map_err(|e| ManifestError::invalid(field, format!("{source}: {e}")))?;
        }
        let rows = rows.finish();
        if rows.is_empty() {
            return Err(ManifestError::invalid(
                field,
                format!("{source}: has no lines"),
            ));
        }
        Ok(Self {
            source: source.to_owned(),
            columns: vec![LINE.to_owned()],
            rows,
        })
    }

    /// A table built by hand (a file's rows come from
    /// [`Table::from_csv`] or [`Table::from_lines`]); it is checked with
    /// the manifest that carries it.
    pub fn new<R, C>(source: &str, columns: Vec<String>, rows: R) -> Result<Self, TooLarge>
    where
        R: IntoIterator,
        R::Item: IntoIterator<Item = C>,
        C: AsRef<str>,
    {
        let mut builder = RowsBuilder::default();
        for row in rows {
            builder.push_row(row)?;
        }
        Ok(Self {
            source: source.to_owned(),
            columns,
            rows: builder.finish(),
        })
    }

    /// How many rows (tasks) it has.
    pub fn rows_len(&self) -> usize {
        self.rows.len()
    }

    /// Row `i`'s cells; `i` must be below `rows_len()`.
    pub fn row(&self, i: usize) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.rows.row(i)
    }

    /// What it holds on the heap, for bounding what a submission costs.
    pub fn heap_bytes(&self) -> usize {
        self.source.capacity()
            + self.columns.capacity() * size_of::<String>()
            + self.columns.iter().map(String::capacity).sum::<usize>()
            + self.rows.heap_bytes()
    }

    /// Its rows, shared.
    pub(crate) fn rows(&self) -> &Rows {
        &self.rows
    }

    /// Checks a table that arrived inside a manifest (sent by hand, say).
    pub(crate) fn check(&self, field: &str) -> Result<(), ManifestError> {
        if self.columns.is_empty() || self.rows.is_empty() {
            return Err(ManifestError::invalid(field, "needs columns and rows"));
        }
        let width = self.columns.len();
        if let Some(i) = (0..self.rows.len()).find(|&i| self.rows.row_len(i) != width) {
            return Err(ManifestError::invalid(
                field,
                format!(
                    "row {} has {} values for {width} columns",
                    i + 1,
                    self.rows.row_len(i),
                ),
            ));
        }
        Ok(())
    }
}

/// A table's rows, packed so that they hold at most 4 bytes for each byte
/// that carried them (MessagePack, JSON or TOML), plus 88 for the table: as
/// `Vec<Vec<String>>` a row of one one-character cell held about 100 bytes.
/// Every cell is an entry of [`Packed`] (its end, 4 bytes, and its text);
/// each row keeps where its cells end (4 bytes). Clones share the buffers.
#[derive(Clone, Default, PartialEq)]
pub(crate) struct Rows(Arc<RowsInner>);

#[derive(Default, PartialEq)]
struct RowsInner {
    cells: Packed,
    /// Row `i`'s cells end before cell `ends[i]`.
    ends: Vec<u32>,
}

impl Rows {
    pub(crate) fn len(&self) -> usize {
        self.0.ends.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where row `i`'s cells start and end; `i` must be below `len()`.
    fn span(&self, i: usize) -> (usize, usize) {
        let start = i.checked_sub(1).map_or(0, |p| self.0.ends[p] as usize);
        (start, self.0.ends[i] as usize)
    }

    /// How many cells row `i` has; `i` must be below `len()`.
    pub(crate) fn row_len(&self, i: usize) -> usize {
        let (start, end) = self.span(i);
        end - start
    }

    /// Row `i`'s cells; `i` must be below `len()`.
    pub(crate) fn row(&self, i: usize) -> impl ExactSizeIterator<Item = &str> + '_ {
        let (start, end) = self.span(i);
        // Cells are pushed as text, so they are UTF-8.
        (start..end).map(|c| std::str::from_utf8(self.0.cells.get(c).1).unwrap_or_default())
    }

    fn heap_bytes(&self) -> usize {
        // The shared block: two counts, the cells' buffers and `ends`.
        2 * size_of::<usize>()
            + size_of::<RowsInner>()
            + self.0.cells.heap_bytes()
            + self.0.ends.capacity() * size_of::<u32>()
    }
}

impl fmt::Debug for Rows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries((0..self.len()).map(|i| self.row(i).collect::<Vec<_>>()))
            .finish()
    }
}

/// Rows as they are read, shrunk to fit when done.
#[derive(Default)]
struct RowsBuilder(RowsInner);

impl RowsBuilder {
    fn with_hint(hint: Option<usize>) -> Self {
        Self(RowsInner {
            cells: Packed::with_hint(hint),
            ends: cautious(hint),
        })
    }

    fn push_cell(&mut self, cell: &str) -> Result<(), TooLarge> {
        self.0.cells.push(0, cell.as_bytes())
    }

    fn end_row(&mut self) -> Result<(), TooLarge> {
        let end = u32::try_from(self.0.cells.len()).map_err(|_| TooLarge)?;
        self.0.ends.push(end);
        Ok(())
    }

    fn push_row<C: AsRef<str>>(
        &mut self,
        row: impl IntoIterator<Item = C>,
    ) -> Result<(), TooLarge> {
        for cell in row {
            self.push_cell(cell.as_ref())?;
        }
        self.end_row()
    }

    fn finish(mut self) -> Rows {
        self.0.cells.shrink();
        self.0.ends.shrink_to_fit();
        Rows(Arc::new(self.0))
    }
}

impl Serialize for Rows {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq((0..self.len()).map(|i| Row(self, i)))
    }
}

/// One row, written as a list of strings.
struct Row<'a>(&'a Rows, usize);

impl Serialize for Row<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.row(self.1))
    }
}

impl<'de> Deserialize<'de> for Rows {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(RowsVisitor)
    }
}

/// Reads `[["1", "x"], ["2", "y"]]` into one builder: no `String` is made.
struct RowsVisitor;

impl<'de> Visitor<'de> for RowsVisitor {
    type Value = Rows;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of rows, each a list of strings")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Rows, A::Error> {
        let mut rows = RowsBuilder::with_hint(seq.size_hint());
        while seq.next_element_seed(RowSeed(&mut rows))?.is_some() {}
        Ok(rows.finish())
    }
}

/// One row, appended to the builder.
struct RowSeed<'a>(&'a mut RowsBuilder);

impl<'de> DeserializeSeed<'de> for RowSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for RowSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a row: a list of strings")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(CellSeed(self.0))?.is_some() {}
        self.0.end_row().map_err(de::Error::custom)
    }
}

/// One cell, appended to the builder.
struct CellSeed<'a>(&'a mut RowsBuilder);

impl<'de> DeserializeSeed<'de> for CellSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_string(self)
    }
}

impl<'de> Visitor<'de> for CellSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.0.push_cell(v).map_err(E::custom)
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<(), E> {
        match std::str::from_utf8(v) {
            Ok(text) => self.visit_str(text),
            Err(_) => Err(E::invalid_value(de::Unexpected::Bytes(v), &self)),
        }
    }
}

/// A parameter's name: it is written `{name}` in commands and becomes
/// `GLEANER_PARAM_<name>` in a task's environment.
pub fn is_param_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn check_size(field: &str, source: &str, data: &[u8]) -> Result<(), ManifestError> {
    if data.len() > MAX_TABLE_BYTES {
        return Err(ManifestError::invalid(
            field,
            format!(
                "{source}: {} MiB; at most {} MiB of rows travel with a manifest \
                 (add the rest to an open job, `gleaner submit --job`, in pieces)",
                data.len() >> 20,
                MAX_TABLE_BYTES >> 20
            ),
        ));
    }
    Ok(())
}

/// csv's message without its own position (the caller names the line).
fn csv_error(e: &csv::Error) -> String {
    match e.kind() {
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => format!("{len} fields where the header has {expected_len}"),
        csv::ErrorKind::Utf8 { .. } => "not UTF-8 text".to_owned(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(t: &Table) -> Vec<Vec<&str>> {
        (0..t.rows_len()).map(|i| t.row(i).collect()).collect()
    }

    #[test]
    fn a_csv_file_gives_named_columns_and_rows() {
        let t = Table::from_csv("sweep.csv", "p.csv", b"alpha, beta\n1,x\n2,\"y, z\"\n").unwrap();
        assert_eq!(t.columns, ["alpha", "beta"]);
        assert_eq!(rows(&t), [vec!["1", "x"], vec!["2", "y, z"]]);
    }

    #[test]
    fn a_bad_csv_file_is_refused_naming_file_and_line() {
        let err = Table::from_csv("sweep.csv", "p.csv", b"a,b\n1,2\n3\n").unwrap_err();
        assert_eq!(err.field(), Some("sweep.csv"));
        assert!(
            err.to_string()
                .contains("p.csv line 3: 1 fields where the header has 2"),
            "{err}"
        );
        let err = Table::from_csv("sweep.csv", "p.csv", b"a,b c\n1,2\n").unwrap_err();
        assert!(err.to_string().contains("p.csv line 1: column 2"), "{err}");
        let err = Table::from_csv("sweep.csv", "p.csv", b"a,a\n1,2\n").unwrap_err();
        assert!(err.to_string().contains("appears twice"), "{err}");
        let err = Table::from_csv("sweep.csv", "p.csv", b"a\n").unwrap_err();
        assert!(err.to_string().contains("no rows"), "{err}");
        let err = Table::from_csv("sweep.csv", "p.csv", b"a\n1\n\xff\n").unwrap_err();
        assert!(err.to_string().contains("p.csv line 3: not UTF-8"), "{err}");
    }

    #[test]
    fn a_spreadsheets_csv_is_read_as_written() {
        // A byte-order mark, CRLF line ends and a blank last line.
        let t = Table::from_csv("sweep.csv", "p.csv", b"\xef\xbb\xbfa,b\r\n1,2\r\n\r\n").unwrap();
        assert_eq!(t.columns, ["a", "b"]);
        assert_eq!(rows(&t), [vec!["1", "2"]]);
    }

    #[test]
    fn a_file_of_lines_gives_one_row_per_line() {
        let t =
            Table::from_lines("sweep.lines", "in.txt", b"\xef\xbb\xbfa b\r\n\n  \nc\n").unwrap();
        assert_eq!(t.columns, [LINE]);
        assert_eq!(rows(&t), [vec!["a b"], vec!["c"]]);
        let err = Table::from_lines("sweep.lines", "in.txt", b"ok\n\xff\n").unwrap_err();
        assert!(
            err.to_string().contains("in.txt line 2: not UTF-8"),
            "{err}"
        );
        assert!(Table::from_lines("sweep.lines", "in.txt", b"\n\n").is_err());
    }

    #[test]
    fn a_table_is_written_and_read_as_rows_of_strings_were() {
        #[derive(Serialize, Deserialize)]
        struct Old {
            source: String,
            columns: Vec<String>,
            rows: Vec<Vec<String>>,
        }
        let cells = [vec!["1", "x"], vec!["", "é, \"z\""], vec!["3"], vec![]];
        let old = Old {
            source: "p.csv".into(),
            columns: vec!["a".into(), "b".into()],
            rows: cells
                .iter()
                .map(|r| r.iter().map(|c| c.to_string()).collect())
                .collect(),
        };
        // Ragged rows too: they are refused by `check`, not by reading.
        let table = Table::new("p.csv", old.columns.clone(), &cells).unwrap();
        assert_eq!(rows(&table), cells);

        let json = serde_json::to_string(&table).unwrap();
        assert_eq!(json, serde_json::to_string(&old).unwrap());
        assert_eq!(serde_json::from_str::<Table>(&json).unwrap(), table);

        let packed = rmp_serde::to_vec_named(&table).unwrap();
        assert_eq!(packed, rmp_serde::to_vec_named(&old).unwrap());
        assert_eq!(rmp_serde::from_slice::<Table>(&packed).unwrap(), table);

        let toml = toml::to_string(&table).unwrap();
        assert_eq!(toml, toml::to_string(&old).unwrap());
        assert_eq!(toml::from_str::<Table>(&toml).unwrap(), table);

        let err = table.check("sweep.csv").unwrap_err();
        assert!(
            err.to_string().contains("row 3 has 1 values for 2 columns"),
            "{err}"
        );
        assert!(
            serde_json::from_str::<Table>(r#"{"source":"p","columns":["a"],"rows":[[1]]}"#)
                .is_err()
        );
        assert!(
            serde_json::from_str::<Table>(r#"{"source":"p","columns":["a"],"rows":["a"]}"#)
                .is_err()
        );
    }
}
