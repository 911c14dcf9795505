//! Sweep rows from data files: a CSV file (its header names the
//! parameters, each row is a task) or a file of lines (each line a task, as
//! `{line}`). `gleaner submit` reads the files, relative to the manifest,
//! and sends their rows inside the manifest: the runner reads no user file.

use serde::{Deserialize, Serialize};

use crate::ManifestError;

/// The rows of one data file, as strings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table {
    /// The file, as the manifest names it (`sweep.csv` or `sweep.lines`).
    pub source: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
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
        let mut rows = Vec::new();
        for record in reader.records() {
            let record =
                record.map_err(|e| at(e.position().map(csv::Position::line), csv_error(&e)))?;
            rows.push(record.iter().map(str::to_owned).collect());
        }
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
        let rows: Vec<Vec<String>> = text
            .strip_prefix('\u{feff}')
            .unwrap_or(text)
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| vec![line.to_owned()])
            .collect();
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

    /// Checks a table that arrived inside a manifest (sent by hand, say).
    pub(crate) fn check(&self, field: &str) -> Result<(), ManifestError> {
        if self.columns.is_empty() || self.rows.is_empty() {
            return Err(ManifestError::invalid(field, "needs columns and rows"));
        }
        if let Some(i) = self.rows.iter().position(|r| r.len() != self.columns.len()) {
            return Err(ManifestError::invalid(
                field,
                format!(
                    "row {} has {} values for {} columns",
                    i + 1,
                    self.rows[i].len(),
                    self.columns.len()
                ),
            ));
        }
        Ok(())
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

    #[test]
    fn a_csv_file_gives_named_columns_and_rows() {
        let t = Table::from_csv("sweep.csv", "p.csv", b"alpha, beta\n1,x\n2,\"y, z\"\n").unwrap();
        assert_eq!(t.columns, ["alpha", "beta"]);
        assert_eq!(t.rows, [vec!["1", "x"], vec!["2", "y, z"]]);
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
        assert_eq!(t.rows, [vec!["1", "2"]]);
    }

    #[test]
    fn a_file_of_lines_gives_one_row_per_line() {
        let t =
            Table::from_lines("sweep.lines", "in.txt", b"\xef\xbb\xbfa b\r\n\n  \nc\n").unwrap();
        assert_eq!(t.columns, [LINE]);
        assert_eq!(t.rows, [vec!["a b"], vec!["c"]]);
        let err = Table::from_lines("sweep.lines", "in.txt", b"ok\n\xff\n").unwrap_err();
        assert!(
            err.to_string().contains("in.txt line 2: not UTF-8"),
            "{err}"
        );
        assert!(Table::from_lines("sweep.lines", "in.txt", b"\n\n").is_err());
    }
}
