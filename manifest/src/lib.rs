//! Job manifests: what a user hands gleaner.
//!
//! A manifest arrives as TOML (from `gleaner submit`) or JSON (published by
//! hand to `gleaner.submit`). This crate parses it, validates it with errors
//! that name the offending field, and expands it into its list of tasks. It
//! does no I/O so that the CLI, the runner and the tests share one definition.

mod expand;
mod job_id;
mod params;
mod spec;

pub use expand::{TaskList, TaskSpec};
pub use job_id::{JobId, JobIdError};
pub use params::{ParamSpec, ParamValue};
pub use spec::{Component, JobKind, Manifest, Priority, Sweep, TaskDef, is_env_name};

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
    /// Parses and validates a TOML manifest.
    pub fn from_toml(text: &str) -> Result<Self, ManifestError> {
        let manifest: Manifest =
            toml::from_str(text).map_err(|e| ManifestError::Syntax(e.to_string()))?;
        manifest.validate()?;
        Ok(manifest)
    }

    /// Parses and validates a JSON manifest (the form a user publishes by hand).
    pub fn from_json(bytes: &[u8]) -> Result<Self, ManifestError> {
        let manifest: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| ManifestError::Syntax(format!("invalid JSON manifest: {e}")))?;
        manifest.validate()?;
        Ok(manifest)
    }
}
