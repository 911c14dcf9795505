//! Expansion of a manifest into its tasks.
//!
//! Tasks are numbered from 0: first the `[[task]]` entries in order, then the
//! sweep's cartesian product: the rows of its data files (`csv`, then
//! `lines`), then its parameters, the last varying fastest. Any task is
//! computed from its number alone, so a million-task range costs no memory
//! and a runner can rebuild any task it must retry.

use indexmap::IndexMap;

use crate::{MAX_TASKS, Manifest, ManifestError, ParamSpec, ParamValue, Sweep, table::Rows};

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
    /// Every parameter's name: the tables' columns, then `params`.
    names: Vec<String>,
    /// The factors of the product, outermost first.
    factors: Vec<Factor>,
    len: u64,
}

/// One factor of a sweep's product: a data file's rows (as many values as
/// it has columns) or one parameter's values.
#[derive(Debug, Clone)]
enum Factor {
    Rows(Rows),
    Param(ParamSpec, u64),
}

impl Factor {
    fn len(&self) -> u64 {
        match self {
            Self::Rows(rows) => rows.len() as u64,
            Self::Param(_, count) => *count,
        }
    }

    /// Writes the values of its `i`th element into `slots`.
    fn fill(&self, i: u64, slots: &mut [ParamValue]) {
        match self {
            Self::Rows(rows) => {
                for (slot, value) in slots.iter_mut().zip(rows.row(i as usize)) {
                    *slot = ParamValue::Text(value.to_owned());
                }
            }
            Self::Param(spec, _) => slots[0] = spec.value(i),
        }
    }

    fn width(&self) -> usize {
        match self {
            Self::Rows(rows) if rows.is_empty() => 0,
            Self::Rows(rows) => rows.row_len(0),
            Self::Param(..) => 1,
        }
    }
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
        if sweep.csv.is_some() && sweep.csv == sweep.lines {
            return Err(ManifestError::invalid(
                "sweep.lines",
                "is the same file as sweep.csv",
            ));
        }
        let mut names: Vec<String> = Vec::new();
        let mut factors = Vec::new();
        let mut len: u64 = 1;
        for (field, source) in [("sweep.csv", &sweep.csv), ("sweep.lines", &sweep.lines)] {
            let Some(source) = source else { continue };
            let table = sweep.table(source).ok_or_else(|| {
                ManifestError::invalid(
                    field,
                    format!(
                        "{source} was not read: `gleaner submit` reads it; a manifest sent otherwise carries its rows in sweep.tables"
                    ),
                )
            })?;
            table.check(field)?;
            for column in &table.columns {
                if names.contains(column) {
                    return Err(ManifestError::invalid(
                        field,
                        format!("{source}: column {column:?} is also a column of sweep.csv"),
                    ));
                }
                names.push(column.clone());
            }
            len = len.saturating_mul(table.rows_len() as u64);
            factors.push(Factor::Rows(table.rows().clone()));
        }
        if let Some(stray) = sweep.tables.iter().find(|t| {
            Some(&t.source) != sweep.csv.as_ref() && Some(&t.source) != sweep.lines.as_ref()
        }) {
            return Err(ManifestError::invalid(
                "sweep.tables",
                format!("{} is neither sweep.csv nor sweep.lines", stray.source),
            ));
        }
        for (name, spec) in &sweep.params {
            let field = format!("sweep.params.{name}");
            if names.contains(name) {
                return Err(ManifestError::invalid(
                    &field,
                    "is also a column of the sweep's data file",
                ));
            }
            let count = spec.len().ok_or_else(|| {
                ManifestError::invalid(&field, "a range needs step > 0 and to >= from")
            })?;
            if count == 0 {
                return Err(ManifestError::invalid(&field, "has no values"));
            }
            if let ParamSpec::List(values) = spec
                && let Some(x) = values.iter().find_map(|v| match v {
                    ParamValue::Float(x) if !x.is_finite() => Some(x),
                    _ => None,
                })
            {
                // JSON, which the results index is, has no such number.
                return Err(ManifestError::invalid(
                    &field,
                    format!("{x} is not a number (write it as a string)"),
                ));
            }
            len = len.saturating_mul(count);
            names.push(name.clone());
            factors.push(Factor::Param(spec.clone(), count));
        }
        if factors.is_empty() {
            return Err(ManifestError::invalid(
                "sweep.params",
                "a sweep needs at least one parameter, a csv file or a lines file",
            ));
        }
        let template = parse_template(&sweep.command, &names)?;
        Ok(Self {
            template,
            names,
            factors,
            len,
        })
    }

    fn get(&self, mut index: u64) -> Option<TaskSpec> {
        if index >= self.len {
            return None;
        }
        let mut values = vec![ParamValue::Int(0); self.names.len()];
        let mut end = values.len();
        for factor in self.factors.iter().rev() {
            let start = end - factor.width();
            let count = factor.len();
            factor.fill(index % count, &mut values[start..end]);
            index /= count;
            end = start;
        }
        let mut command = String::new();
        for segment in &self.template {
            match segment {
                Segment::Text(text) => command.push_str(text),
                Segment::Param(i) => command.push_str(&values[*i].to_string()),
            }
        }
        let params = self.names.iter().cloned().zip(values).collect();
        Some(TaskSpec { command, params })
    }
}

/// Splits `./solve --seed {seed}` into text and parameter references.
/// `{{` and `}}` stand for literal braces (so `${{HOME}}` reaches the shell as `${HOME}`).
fn parse_template(command: &str, names: &[String]) -> Result<Vec<Segment>, ManifestError> {
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
                let index = names.iter().position(|n| *n == name).ok_or_else(|| {
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
    use crate::Table;

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
        for x in ["nan", "inf", "-inf"] {
            let text = format!(
                "name = \"s\"\n[sweep]\ncommand = \"{{x}}\"\nparams = {{ x = [1.5, {x}] }}\n"
            );
            let err = list(&text).unwrap_err();
            assert_eq!(err.field(), Some("sweep.params.x"), "{err}");
        }
    }

    #[test]
    fn data_file_rows_come_before_parameters_and_travel_with_the_manifest() {
        let files = |name: &str| match name {
            "p.csv" => Ok(b"x,y\n1,a\n2,b\n".to_vec()),
            "l.txt" => Ok(b"u\nv\n".to_vec()),
            _ => Err("no such file".to_owned()),
        };
        let text = "name = \"s\"\n[sweep]\ncommand = \"{x}{y}{line}{n}\"\ncsv = \"p.csv\"\nlines = \"l.txt\"\nparams = { n = [0, 1] }\n";
        let manifest = Manifest::from_toml_reading(text, files).unwrap();
        let tasks = TaskList::new(&manifest).unwrap();
        let commands: Vec<String> = (0..tasks.len())
            .map(|i| tasks.get(i).unwrap().command)
            .collect();
        assert_eq!(
            commands,
            [
                "1au0", "1au1", "1av0", "1av1", "2bu0", "2bu1", "2bv0", "2bv1"
            ]
        );
        let params = tasks.get(5).unwrap().params;
        assert_eq!(params["x"], ParamValue::Text("2".into()));
        assert_eq!(params["line"], ParamValue::Text("u".into()));
        assert_eq!(params["n"], ParamValue::Int(1));

        // The runner gets the rows inside the manifest, and reads no file.
        let json = serde_json::to_vec(&manifest).unwrap();
        assert_eq!(Manifest::from_json(&json).unwrap(), manifest);
        let err = Manifest::from_toml(text).unwrap_err();
        assert_eq!(err.field(), Some("sweep.csv"), "{err}");
        let err =
            Manifest::from_toml_reading(&text.replace("l.txt", "gone.txt"), files).unwrap_err();
        assert!(
            err.to_string()
                .contains("sweep.lines: gone.txt: no such file"),
            "{err}"
        );

        // Rows sent by hand are checked like read ones.
        let mut broken = manifest.clone();
        let table = &mut broken.sweep.as_mut().unwrap().tables[0];
        *table = Table::new(
            &table.source,
            table.columns.clone(),
            [vec!["1", "a"], vec!["2"]],
        )
        .unwrap();
        let err = broken.validate().unwrap_err();
        assert!(
            err.to_string()
                .contains("sweep.csv: row 2 has 1 values for 2 columns"),
            "{err}"
        );
        let mut stray = manifest.clone();
        stray.sweep.as_mut().unwrap().lines = None;
        let err = stray.validate().unwrap_err();
        assert_eq!(err.field(), Some("sweep.tables"), "{err}");
        let err = Manifest::from_toml_reading(&text.replace("l.txt", "p.csv"), files).unwrap_err();
        assert_eq!(err.field(), Some("sweep.lines"), "{err}");
    }
}
