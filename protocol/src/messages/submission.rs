//! What `gleaner submit` publishes on `gleaner.submit`.

use super::*;

/// A manifest on `gleaner.submit`, as `gleaner submit` sends it. Manifests
/// published by hand as JSON carry no envelope; the runner names those itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Submission {
    pub job: JobId,
    pub manifest: Manifest,
    pub submitted_at: Millis,
}

impl Message for Submission {
    fn kind(&self) -> &'static str {
        "submit"
    }
}
