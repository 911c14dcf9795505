//! Tasks added to an open job (`gleaner submit --job JOB more.toml`).

use serde::{Deserialize, Serialize};

use crate::{Manifest, ManifestError, Sweep, TaskDef, TaskList};

/// `[[task]]` entries and a `[sweep]`, as in a manifest, numbered after the
/// tasks the job has so far. Nothing else: the job's other settings are
/// its manifest's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Addition {
    /// Chosen by its sender: an addition that arrives twice is added once.
    #[serde(default)]
    pub id: u64,
    #[serde(default, rename = "task", skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskDef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<Sweep>,
}

impl Addition {
    /// Parses an addition, reads its sweep's data files through `read` (as
    /// [`Manifest::from_toml_reading`] does) and checks it as a manifest's
    /// tasks are checked.
    pub fn from_toml_reading(
        text: &str,
        read: impl FnMut(&str) -> Result<Vec<u8>, String>,
    ) -> Result<Self, ManifestError> {
        Self::parse_toml(text)?.complete(read)
    }

    /// Parses a TOML addition without checking it ([`Addition::complete`]
    /// does).
    pub fn parse_toml(text: &str) -> Result<Self, ManifestError> {
        toml::from_str(text).map_err(not_an_addition)
    }

    /// [`Addition::parse_toml`] for JSON.
    pub fn parse_json(bytes: &[u8]) -> Result<Self, ManifestError> {
        serde_json::from_slice(bytes).map_err(not_an_addition)
    }

    /// Reads its sweep's data files through `read` and checks it as a
    /// manifest's tasks are checked.
    pub fn complete(
        self,
        read: impl FnMut(&str) -> Result<Vec<u8>, String>,
    ) -> Result<Self, ManifestError> {
        let manifest = self.as_manifest().complete(read)?;
        Ok(Self {
            id: self.id,
            tasks: manifest.tasks,
            sweep: manifest.sweep,
        })
    }

    /// Its tasks, checked as a manifest's (for an addition that arrived by
    /// message).
    pub fn task_list(&self) -> Result<TaskList, ManifestError> {
        let manifest = self.as_manifest();
        manifest.validate()?;
        TaskList::new(&manifest)
    }

    fn as_manifest(&self) -> Manifest {
        Manifest {
            tasks: self.tasks.clone(),
            sweep: self.sweep.clone(),
            ..Manifest::named("addition")
        }
    }
}

fn not_an_addition(e: impl std::fmt::Display) -> ManifestError {
    ManifestError::Syntax(format!(
        "{e}\n(an addition holds [[task]] entries and a [sweep] only; the job's other settings are its manifest's)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_addition_is_tasks_and_a_sweep_with_its_files() {
        let text = "[[task]]\ncommand = \"echo one\"\n[sweep]\ncommand = \"run {line}\"\nlines = \"more.txt\"\n";
        let addition = Addition::from_toml_reading(text, |name| {
            assert_eq!(name, "more.txt");
            Ok(b"a\nb\n".to_vec())
        })
        .unwrap();
        let tasks = addition.task_list().unwrap();
        assert_eq!(tasks.len(), 3);
        assert_eq!(tasks.get(2).unwrap().command, "run b");
    }

    #[test]
    fn anything_else_or_nothing_is_refused() {
        let other =
            Addition::from_toml_reading("name = \"x\"\n[[task]]\ncommand = \"true\"\n", |_| {
                Err("no files".to_owned())
            })
            .unwrap_err();
        assert!(
            other
                .to_string()
                .contains("[[task]] entries and a [sweep] only"),
            "{other}"
        );
        let empty = Addition::from_toml_reading("", |_| Err("no files".to_owned())).unwrap_err();
        assert!(empty.to_string().contains("no tasks"), "{empty}");
    }

    #[test]
    fn an_addition_in_json_is_the_same_as_in_toml() {
        let json = br#"{"task": [{"command": "echo one"}, {"command": "echo two"}]}"#;
        let addition = Addition::parse_json(json)
            .and_then(|a| a.complete(|_| Err("no files".to_owned())))
            .unwrap();
        let toml = Addition::from_toml_reading(
            "[[task]]\ncommand = \"echo one\"\n[[task]]\ncommand = \"echo two\"\n",
            |_| Err("no files".to_owned()),
        )
        .unwrap();
        assert_eq!(addition, toml);
        let other = Addition::parse_json(br#"{"name": "x", "task": []}"#).unwrap_err();
        assert!(other.to_string().contains("[sweep] only"), "{other}");
    }
}
