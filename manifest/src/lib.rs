//! Job manifests: what a user hands gleaner.
//!
//! A manifest arrives as TOML (from `gleaner submit`) or JSON (published by
//! hand to `gleaner.submit`). This crate parses it, validates it with errors
//! that name the offending field, and expands it into its list of tasks. It
//! does no I/O (the caller hands it the sweep's data files) so that the CLI,
//! the runner and the tests share one definition.

mod addition;
mod bounded;
mod compact;
mod expand;
mod job_id;
mod moldable;
mod needs;
mod params;
mod span;
mod spec;
mod table;
mod task_set;

pub use addition::Addition;
pub use compact::{MAX_PACKED_BYTES, TooLarge};
pub use expand::{MAX_TASK_BYTES, TaskList, TaskSpec};
pub use job_id::{JobId, JobIdError};
pub use moldable::{Curve, MAX_MOLDABLE_SLOTS, Moldable, Slots, Speedup};
pub use needs::{MAX_TASK_GPUS, MAX_TASK_MEMORY_MB, Memory, Needs, TaskShape};
pub use params::{ParamList, ParamSpec, ParamValue};
pub use span::Span;
pub use spec::{
    Component, FinalStep, FinalWhen, JobKind, MAX_BUNDLE, MAX_PREEMPT_GRACE, Manifest, Priority,
    Rerun, Sweep, TaskDef, is_env_name, preempt_signal_number,
};
pub use table::{LINE, MAX_TABLE_BYTES, Table, is_param_name};
pub use task_set::TaskSet;

/// Upper bound on the number of tasks of one job; a sweep beyond it is almost
/// certainly a typo in a range, and would not fit a results directory anyway.
pub const MAX_TASKS: u64 = 10_000_000;

/// Why a manifest was refused. `field` names the offending key in the
/// manifest's own terms (`sweep.params.seed`), so the user can find it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("{0}")]
    Syntax(String),
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

impl ManifestError {
    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The field the error is about, when it is about one field.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Syntax(_) => None,
            Self::Invalid { field, .. } => Some(field),
        }
    }
}

impl Manifest {
    /// Parses and validates a TOML manifest whose data files, if any, were
    /// read already.
    pub fn from_toml(text: &str) -> Result<Self, ManifestError> {
        Self::from_toml_reading(text, no_files)
    }

    /// Parses a TOML manifest, reads the sweep's data files through `read`
    /// (given the name as written; `gleaner submit` reads it relative to
    /// the manifest) into its rows, and validates the whole.
    pub fn from_toml_reading(
        text: &str,
        read: impl FnMut(&str) -> Result<Vec<u8>, String>,
    ) -> Result<Self, ManifestError> {
        Self::parse_toml(text)?.complete(read)
    }

    /// Parses a TOML manifest without checking it, for a caller that sets
    /// something first; [`Manifest::complete`] then reads its files and
    /// checks it.
    pub fn parse_toml(text: &str) -> Result<Self, ManifestError> {
        toml::from_str(text).map_err(|e| ManifestError::Syntax(e.to_string()))
    }

    /// [`Manifest::parse_toml`] for JSON.
    pub fn parse_json(bytes: &[u8]) -> Result<Self, ManifestError> {
        serde_json::from_slice(bytes)
            .map_err(|e| ManifestError::Syntax(format!("invalid JSON manifest: {e}")))
    }

    /// Parses and validates a JSON manifest (the form a user publishes by
    /// hand, with any data files' rows in `sweep.tables`).
    pub fn from_json(bytes: &[u8]) -> Result<Self, ManifestError> {
        Self::from_json_reading(bytes, no_files)
    }

    /// [`Manifest::from_toml_reading`] for JSON.
    pub fn from_json_reading(
        bytes: &[u8],
        read: impl FnMut(&str) -> Result<Vec<u8>, String>,
    ) -> Result<Self, ManifestError> {
        Self::parse_json(bytes)?.complete(read)
    }

    /// Reads the sweep's data files not read yet, then validates.
    pub fn complete(
        mut self,
        mut read: impl FnMut(&str) -> Result<Vec<u8>, String>,
    ) -> Result<Self, ManifestError> {
        if let Some(sweep) = self.sweep.as_mut() {
            type Parse = fn(&str, &str, &[u8]) -> Result<Table, ManifestError>;
            let files: [(&str, Option<String>, Parse); 2] = [
                ("sweep.csv", sweep.csv.clone(), Table::from_csv),
                ("sweep.lines", sweep.lines.clone(), Table::from_lines),
            ];
            for (field, source, parse) in files {
                let Some(source) = source else { continue };
                if sweep.table(&source).is_some() {
                    continue;
                }
                let data = read(&source)
                    .map_err(|e| ManifestError::invalid(field, format!("{source}: {e}")))?;
                sweep.tables.push(parse(field, &source, &data)?);
            }
        }
        self.validate()?;
        Ok(self)
    }
}

/// The reader of a manifest that arrives without its files.
fn no_files(name: &str) -> Result<Vec<u8>, String> {
    Err(format!(
        "not read (`gleaner submit` reads {name}; a manifest sent otherwise carries its rows in sweep.tables)"
    ))
}
