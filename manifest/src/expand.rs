//! Expansion of a manifest into its tasks.
//!
//! Tasks are numbered from 0: first the `[[task]]` entries in order, then the
//! sweep's cartesian product with the last parameter varying fastest. Any task
//! is computed from its number alone, so a million-task sweep costs no memory
//! and a runner can rebuild any task it must retry.

use indexmap::IndexMap;

use crate::{MAX_TASKS, Manifest, ManifestError, ParamSpec, ParamValue, Sweep};

/// One task, as the runner publishes it and the results index records it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    pub command: String,
    pub params: IndexMap<String, ParamValue>,
}

/// All the tasks of a manifest, computed on demand.
#[derive(Debug, Clone)]
pub struct TaskList {
    fixed: Vec<String>,
    sweep: Option<SweepPlan>,
}

#[derive(Debug, Clone)]
struct SweepPlan {
    template: Vec<Segment>,
    params: Vec<(String, ParamSpec, u64)>,
    len: u64,
}

#[derive(Debug, Clone, PartialEq)]
enum Segment {
    Text(String),
    Param(usize),
}

impl TaskList {
    pub fn new(manifest: &Manifest) -> Result<Self, ManifestError> {
        let fixed: Vec<String> = manifest.tasks.iter().map(|t| t.command.clone()).collect();
        let sweep = manifest.sweep.as_ref().map(SweepPlan::new).transpose()?;
        let list = Self { fixed, sweep };
        if list.len() > MAX_TASKS {
            return Err(ManifestError::invalid(
                "sweep.params",
                format!(
                    "the job would have {} tasks; at most {MAX_TASKS} are allowed",
                    list.len()
                ),
            ));
        }
        Ok(list)
    }

    pub fn len(&self) -> u64 {
        self.fixed.len() as u64 + self.sweep.as_ref().map_or(0, |s| s.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The task numbered `index`, or `None` beyond the end.
    pub fn get(&self, index: u64) -> Option<TaskSpec> {
        let fixed = self.fixed.len() as u64;
        if index < fixed {
            return Some(TaskSpec {
                command: self.fixed[index as usize].clone(),
                params: IndexMap::new(),
            });
        }
        self.sweep.as_ref()?.get(index - fixed)
    }
}

impl SweepPlan {
    fn new(sweep: &Sweep) -> Result<Self, ManifestError> {
        if sweep.params.is_empty() {
            return Err(ManifestError::invalid(
                "sweep.params",
                "a sweep needs at least one parameter",
            ));
        }
        let mut params = Vec::with_capacity(sweep.params.len());
        let mut len: u64 = 1;
        for (name, spec) in &sweep.params {
            let field = format!("sweep.params.{name}");
            let count = spec.len().ok_or_else(|| {
                ManifestError::invalid(&field, "a range needs step > 0 and to >= from")
            })?;
            if count == 0 {
                return Err(ManifestError::invalid(&field, "has no values"));
            }
            len = len.saturating_mul(count);
            params.push((name.clone(), spec.clone(), count));
        }
        let template = parse_template(&sweep.command, &sweep.params)?;
        Ok(Self {
            template,
            params,
            len,
        })
    }

    fn get(&self, mut index: u64) -> Option<TaskSpec> {
        if index >= self.len {
            return None;
        }
        let mut values = vec![ParamValue::Int(0); self.params.len()];
        for (slot, (_, spec, count)) in values.iter_mut().zip(&self.params).rev() {
            *slot = spec.value(index % count);
            index /= count;
        }
        let mut command = String::new();
        for segment in &self.template {
            match segment {
                Segment::Text(text) => command.push_str(text),
                Segment::Param(i) => command.push_str(&values[*i].to_string()),
            }
        }
        let params = self
            .params
            .iter()
            .map(|(name, _, _)| name.clone())
            .zip(values)
            .collect();
        Some(TaskSpec { command, params })
    }
}

/// Splits `./solve --seed {seed}` into text and parameter references.
/// `{{` and `}}` stand for literal braces (so `${{HOME}}` reaches the shell as `${HOME}`).
fn parse_template(
    command: &str,
    params: &IndexMap<String, ParamSpec>,
) -> Result<Vec<Segment>, ManifestError> {
    let mut segments = Vec::new();
    let mut text = String::new();
    let mut chars = command.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '{' => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => name.push(c),
                        None => {
                            return Err(ManifestError::invalid(
                                "sweep.command",
                                format!("unclosed '{{{name}' (write {{{{ for a literal brace)"),
                            ));
                        }
                    }
                }
                let index = params.get_index_of(name.as_str()).ok_or_else(|| {
                    ManifestError::invalid(
                        "sweep.command",
                        format!(
                            "{{{name}}} is not a parameter of the sweep (write {{{{ and }}}} for literal braces)"
                        ),
                    )
                })?;
                if !text.is_empty() {
                    segments.push(Segment::Text(std::mem::take(&mut text)));
                }
                segments.push(Segment::Param(index));
            }
            '}' => {
                return Err(ManifestError::invalid(
                    "sweep.command",
                    "unmatched '}' (write }} for a literal brace)",
                ));
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        segments.push(Segment::Text(text));
    }
    Ok(segments)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(text: &str) -> Result<TaskList, ManifestError> {
        let manifest: Manifest = toml::from_str(text).unwrap();
        TaskList::new(&manifest)
    }

    #[test]
    fn fixed_tasks_come_first_then_the_product_last_parameter_fastest() {
        let tasks = list(
            r#"
name = "s"
[[task]]
command = "echo first"
[sweep]
command = "run {seed} {size}"
params = { seed = { from = 1, to = 3 }, size = [16, 32] }
"#,
        )
        .unwrap();
        assert_eq!(tasks.len(), 7);
        let commands: Vec<String> = (0..7).map(|i| tasks.get(i).unwrap().command).collect();
        assert_eq!(
            commands,
            [
                "echo first",
                "run 1 16",
                "run 1 32",
                "run 2 16",
                "run 2 32",
                "run 3 16",
                "run 3 32"
            ]
        );
        assert!(tasks.get(7).is_none());
        let params = tasks.get(6).unwrap().params;
        assert_eq!(params["seed"], ParamValue::Int(3));
        assert_eq!(params["size"], ParamValue::Int(32));
    }

    #[test]
    fn range_steps_and_value_kinds() {
        let tasks = list(
            r#"
name = "s"
[sweep]
command = "x={x} y={y} z={z}"
params = { x = { from = 0, to = 10, step = 5 }, y = [0.5, 1.0], z = ["a b", true] }
"#,
        )
        .unwrap();
        assert_eq!(tasks.len(), 12);
        assert_eq!(tasks.get(0).unwrap().command, "x=0 y=0.5 z=a b");
        assert_eq!(tasks.get(11).unwrap().command, "x=10 y=1.0 z=true");
    }

    #[test]
    fn braces_escape_and_unknown_placeholders_are_refused() {
        let tasks =
            list("name = \"s\"\n[sweep]\ncommand = \"echo ${{HOME}} {n}\"\nparams = { n = [1] }\n")
                .unwrap();
        assert_eq!(tasks.get(0).unwrap().command, "echo ${HOME} 1");
        let err = list("name = \"s\"\n[sweep]\ncommand = \"echo {m}\"\nparams = { n = [1] }\n")
            .unwrap_err();
        assert_eq!(err.field(), Some("sweep.command"));
        assert!(err.to_string().contains("{m}"), "{err}");
        let err = list("name = \"s\"\n[sweep]\ncommand = \"echo {n\"\nparams = { n = [1] }\n")
            .unwrap_err();
        assert_eq!(err.field(), Some("sweep.command"));
    }

    #[test]
    fn malformed_ranges_and_huge_products_are_refused() {
        let err = list(
            "name = \"s\"\n[sweep]\ncommand = \"{n}\"\nparams = { n = { from = 5, to = 1 } }\n",
        )
        .unwrap_err();
        assert_eq!(err.field(), Some("sweep.params.n"));
        let err = list(
            "name = \"s\"\n[sweep]\ncommand = \"{a}{b}\"\nparams = { a = { from = 1, to = 100000 }, b = { from = 1, to = 1000 } }\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("at most"), "{err}");
    }
}
