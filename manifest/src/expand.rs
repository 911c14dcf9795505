//! Expansion of a manifest into its tasks.
//!
//! Tasks are numbered from 0: first the `[[task]]` entries in order, then the
//! sweep's cartesian product: the rows of its data files (`csv`, then
//! `lines`), then its parameters, the last varying fastest. Any task is
//! computed from its number alone, so a million-task range costs no memory
//! and a runner can rebuild any task it must retry.

use indexmap::IndexMap;

use crate::{
    MAX_TASKS, Manifest, ManifestError, ParamSpec, ParamValue, Sweep, is_param_name, table::Rows,
};

/// The most one task may weigh as a message (its command, environment,
/// parameters and outputs, as `TaskMsg::weight` counts them): a message
/// holds 16 MiB, a bundle packs tasks up to 4 MiB, and a task bigger than
/// this wants its data in a file.
pub const MAX_TASK_BYTES: usize = 1 << 20;

/// What a task's message counts for each variable beside its name and
/// value (as `TaskMsg::weight` does).
pub(crate) const ENV_ENTRY_BYTES: usize = 8;

/// The variable each parameter also reaches its task as.
pub(crate) const PARAM_VAR_PREFIX: &str = "GLEANER_PARAM_";

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

    /// Its element that weighs most in a task, and that weight, where its
    /// values (its columns' in order) weigh `per_byte` each per byte: the
    /// first such element.
    fn heaviest(&self, per_byte: &[usize]) -> (u64, usize) {
        let weigh = |values: &mut dyn Iterator<Item = usize>| -> usize {
            values
                .zip(per_byte)
                .map(|(len, n)| len.saturating_mul(*n))
                .fold(0, usize::saturating_add)
        };
        let mut best = (0, 0);
        let mut consider = |i: u64, weight: usize| {
            if weight > best.1 {
                best = (i, weight);
            }
        };
        match self {
            Self::Rows(rows) => {
                for i in 0..rows.len() {
                    consider(i as u64, weigh(&mut rows.row(i).map(str::len)));
                }
            }
            Self::Param(ParamSpec::List(values), _) => {
                for (i, value) in values.iter().enumerate() {
                    consider(i as u64, weigh(&mut std::iter::once(text_len(&value))));
                }
            }
            // An arithmetic sequence's longest number is at one of its
            // ends: the one farthest from zero on its side.
            Self::Param(spec @ ParamSpec::Range { .. }, count) => {
                for i in [0, count.saturating_sub(1)] {
                    consider(i, weigh(&mut std::iter::once(text_len(&spec.value(i)))));
                }
            }
        }
        best
    }
}

/// The length of a value as its task's command and environment have it.
fn text_len(value: &ParamValue) -> usize {
    match value {
        ParamValue::Text(text) => text.len(),
        other => other.to_string().len(),
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

    /// Its `[[task]]` entries, which come first.
    pub(crate) fn fixed_len(&self) -> u64 {
        self.fixed.len() as u64
    }

    /// The task that weighs most as a message, without the parts every
    /// task of the job carries alike (`Manifest::task_base_bytes`): its
    /// number and its command's and parameters' bytes (each parameter is
    /// also a variable, `GLEANER_PARAM_<name>`). Found without expanding
    /// the product: a command is its fixed text and, for each parameter,
    /// its value as many times as it appears, so the heaviest value of each
    /// factor (a parameter, or a data file's row) makes the heaviest task.
    /// The first of equals; `None` without tasks.
    pub fn largest(&self) -> Option<(u64, usize)> {
        let fixed = self
            .fixed
            .iter()
            .enumerate()
            .map(|(i, command)| (i as u64, command.len()))
            .rev()
            .max_by_key(|(_, bytes)| *bytes);
        let swept = self.sweep.as_ref().filter(|s| s.len > 0).map(|s| {
            let (index, bytes) = s.largest();
            (self.fixed_len() + index, bytes)
        });
        match (fixed, swept) {
            (Some(f), Some(s)) if s.1 > f.1 => Some(s),
            (Some(f), _) => Some(f),
            (None, s) => s,
        }
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

    /// [`TaskList::largest`] of the product: its number in the product.
    fn largest(&self) -> (u64, usize) {
        let mut uses = vec![0usize; self.names.len()];
        let mut text = 0usize;
        for segment in &self.template {
            match segment {
                Segment::Text(t) => text = text.saturating_add(t.len()),
                Segment::Param(i) => uses[*i] = uses[*i].saturating_add(1),
            }
        }
        // Each value weighs its uses in the command, and once more as a
        // variable where its name can be one; the variables' names alike.
        let mut bytes = text;
        for (name, uses) in self.names.iter().zip(uses.iter_mut()) {
            if is_param_name(name) {
                *uses = uses.saturating_add(1);
                bytes = bytes.saturating_add(PARAM_VAR_PREFIX.len() + name.len() + ENV_ENTRY_BYTES);
            }
        }
        let mut index = 0u64;
        let mut start = 0;
        for factor in &self.factors {
            let end = start + factor.width();
            let (heaviest, weight) = factor.heaviest(&uses[start..end]);
            index = index * factor.len() + heaviest;
            bytes = bytes.saturating_add(weight);
            start = end;
        }
        (index, bytes)
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

    /// What a task weighs beside its job's common parts, as a runner's
    /// message counts it: the command, and each parameter as a variable.
    fn weight(task: &TaskSpec) -> usize {
        task.command.len()
            + task
                .params
                .iter()
                .filter(|(name, _)| is_param_name(name))
                .map(|(name, value)| {
                    PARAM_VAR_PREFIX.len() + name.len() + value.to_string().len() + ENV_ENTRY_BYTES
                })
                .sum::<usize>()
    }

    #[test]
    fn the_heaviest_task_is_found_without_expanding_the_product() {
        let files = |name: &str| match name {
            "p.csv" => Ok(b"x,y\n1,aaaaaaa\n22222,b\n333,cc\n".to_vec()),
            "l.txt" => Ok(b"u\nvvvvvvvvvv\nw\n".to_vec()),
            _ => Err("no such file".to_owned()),
        };
        let text = "name = \"s\"\n[[task]]\ncommand = \"echo fixed\"\n[sweep]\n\
            command = \"{x}{x}{x} {y} {line} {n}{n} {f} {t}\"\ncsv = \"p.csv\"\nlines = \"l.txt\"\n\
            params = { n = { from = -1000, to = 5, step = 7 }, f = [0.5, 12.25, 3.0], t = [\"a\", true] }\n";
        let manifest = Manifest::from_toml_reading(text, files).unwrap();
        let tasks = TaskList::new(&manifest).unwrap();
        let brute = (0..tasks.len())
            .map(|i| (i, weight(&tasks.get(i).unwrap())))
            .rev()
            .max_by_key(|(_, w)| *w)
            .unwrap();
        assert_eq!(tasks.largest(), Some(brute));
        let upward = list(
            "name = \"s\"\n[sweep]\ncommand = \"{n}\"\nparams = { n = { from = 3, to = 100000, step = 3 } }\n",
        )
        .unwrap();
        let (index, _) = upward.largest().unwrap();
        assert_eq!(upward.get(index).unwrap().command, "99999");
        let wide = list(&format!(
            "name = \"s\"\n[sweep]\ncommand = \"{{n}}\"\nparams = {{ n = {{ from = {}, to = {}, step = {} }} }}\n",
            i64::MIN + 1,
            i64::MAX,
            i64::MAX
        ))
        .unwrap();
        let (index, _) = wide.largest().unwrap();
        assert_eq!(wide.get(index).unwrap().command, (i64::MIN + 1).to_string());
        assert_eq!(wide.get(2).unwrap().command, i64::MAX.to_string());
        let fixed = list(
            "name = \"s\"\n[[task]]\ncommand = \"a\"\n[[task]]\ncommand = \"ccc\"\n[[task]]\ncommand = \"bbb\"\n",
        )
        .unwrap();
        assert_eq!(fixed.largest(), Some((1, 3)), "the first of equals");
    }

    #[test]
    fn a_task_too_heavy_for_a_message_is_refused_with_its_number() {
        // One value of 100,000 characters, used 200 times: 19 MiB a task.
        let long = "v".repeat(100_000);
        let uses = "{x} ".repeat(200);
        let text = format!(
            "name = \"s\"\n[sweep]\ncommand = \"echo {uses}\"\nparams = {{ n = [1, 2], x = [\"a\", \"{long}\", \"b\"] }}\n"
        );
        let err = Manifest::from_toml(&text).unwrap_err();
        assert_eq!(err.field(), Some("sweep.command"), "{err}");
        assert!(
            err.to_string()
                .contains("task 1 would take 19.2 MiB as a message"),
            "{err}"
        );
        assert!(err.to_string().contains("at most 1 MiB"), "{err}");
        let fits = text.replace(&uses, "{x}");
        Manifest::from_toml(&fits).unwrap();

        let fixed = format!(
            "name = \"s\"\n[[task]]\ncommand = \"true\"\n[[task]]\ncommand = \"echo {}\"\n",
            "w".repeat(MAX_TASK_BYTES)
        );
        let err = Manifest::from_toml(&fixed).unwrap_err();
        assert_eq!(err.field(), Some("task[1].command"), "{err}");
        // What every task carries counts for each.
        let env = format!(
            "name = \"s\"\nenv = {{ BIG = \"{}\" }}\n[[task]]\ncommand = \"true\"\n",
            "e".repeat(MAX_TASK_BYTES)
        );
        let err = Manifest::from_toml(&env).unwrap_err();
        assert!(err.to_string().contains("task 0 would take"), "{err}");
        let last = format!(
            "name = \"s\"\n[[task]]\ncommand = \"true\"\n[final]\ncommand = \"echo {}\"\n",
            "f".repeat(MAX_TASK_BYTES)
        );
        let err = Manifest::from_toml(&last).unwrap_err();
        assert_eq!(err.field(), Some("final.command"), "{err}");
    }
}
