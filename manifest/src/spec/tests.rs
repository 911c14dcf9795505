use super::*;

fn parse(text: &str) -> Result<Manifest, ManifestError> {
    Manifest::from_toml(text)
}

#[test]
fn max_launchers_is_a_positive_limit() {
    let with = |n: &str| {
        parse(&format!(
            "name = \"s\"\nmax_launchers = {n}\n[[task]]\ncommand = \"true\"\n"
        ))
    };
    assert_eq!(with("4").unwrap().max_launchers, Some(4));
    assert!(with("0").unwrap_err().to_string().contains("max_launchers"));
    assert!(with("-1").is_err());
}

#[test]
fn full_example_parses() {
    let m = parse(
        r#"
name = "sweep"
kind = "scavenge"
max_attempts = 3
walltime = "10m"
results = "results/sweep"
env = { OMP_NUM_THREADS = "1" }
outputs = ["*.png"]

[[task]]
command = "echo one"

[sweep]
command = "./solve --seed {seed} --size {size}"
params = { seed = { from = 1, to = 1000 }, size = [16, 32] }
"#,
    )
    .unwrap();
    assert_eq!(m.walltime, Some(Duration::from_secs(600)));
    assert_eq!(m.env["OMP_NUM_THREADS"], "1");
    assert_eq!(TaskList::new(&m).unwrap().len(), 2001);
    assert_eq!(m.effective_priority(), Priority::SuperLow);
}

#[test]
fn defaults_apply() {
    let m = parse("name = \"a\"\n[[task]]\ncommand = \"true\"\n").unwrap();
    assert_eq!(m.kind, JobKind::Scavenge);
    assert_eq!(m.max_attempts, 3);
    assert_eq!(m.walltime, None);
    assert_eq!(
        m.results_dir("a-0000000000000000"),
        PathBuf::from("results/a-0000000000000000")
    );
}

#[test]
fn results_cannot_climb_out_of_the_results_root() {
    for results in [
        "../../../../tmp/elsewhere",
        "a/../../b",
        "",
        "/tmp/elsewhere",
    ] {
        let err = parse(&format!(
            "name = \"a\"\nresults = \"{results}\"\n[[task]]\ncommand = \"true\"\n"
        ))
        .unwrap_err();
        assert_eq!(err.field(), Some("results"), "{results:?}: {err}");
    }
    let m = parse("name = \"a\"\nresults = \"runs/x..y\"\n[[task]]\ncommand = \"true\"\n").unwrap();
    assert_eq!(
        m.results_dir("a-0000000000000000"),
        PathBuf::from("runs/x..y")
    );
}

#[test]
fn bad_toml_is_a_syntax_error_with_a_line() {
    let err = parse("name = \"a\nbroken").unwrap_err();
    assert!(matches!(err, ManifestError::Syntax(_)));
    assert!(err.to_string().contains("line 2"), "{err}");
}

#[test]
fn unknown_field_is_named() {
    let err = parse("name = \"a\"\nwalltim = \"1m\"\n[[task]]\ncommand = \"true\"\n").unwrap_err();
    assert!(err.to_string().contains("walltim"), "{err}");
}

#[test]
fn memory_and_gpus_are_read_and_bad_ones_named() {
    let m =
        parse("name = \"a\"\nmemory = \"8G\"\ngpus = 2\n[[task]]\ncommand = \"true\"\n").unwrap();
    assert_eq!(
        m.task_needs(),
        Needs {
            memory_mb: 8192,
            gpus: 2
        }
    );
    let err = parse("name = \"a\"\nmemory = \"8\"\n[[task]]\ncommand = \"true\"\n").unwrap_err();
    assert!(
        err.to_string().contains("memory: \"8\" is not a size"),
        "{err}"
    );
    let err = parse("name = \"a\"\nmemory = 8\n[[task]]\ncommand = \"true\"\n").unwrap_err();
    assert!(err.to_string().contains("memory"), "{err}");
    let err = parse("name = \"a\"\ngpus = 65\n[[task]]\ncommand = \"true\"\n").unwrap_err();
    assert_eq!(err.field(), Some("gpus"));
    let err = parse("name = \"a\"\ngpus = -1\n[[task]]\ncommand = \"true\"\n").unwrap_err();
    assert!(err.to_string().contains("gpus"), "{err}");
    let grid = "name = \"g\"\nkind = \"grid\"\n[[component]]\nslots = 2\nmemory = \"64G\"\ngpus = 4\ncommand = \"./mpi\"\n";
    let m = parse(grid).unwrap();
    assert_eq!(m.components[0].needs().gpus, 4);
    let err = parse(&grid.replace("kind", "gpus = 1\nkind")).unwrap_err();
    assert_eq!(err.field(), Some("gpus"));
    let err = parse(&grid.replace("gpus = 4", "gpus = 129")).unwrap_err();
    assert_eq!(err.field(), Some("component[0].gpus"));
}

#[test]
fn a_final_step_may_have_a_shape_of_its_own() {
    let base = "name = \"a\"\nmemory = \"1G\"\n[[task]]\ncommand = \"true\"\n[final]\ncommand = \"merge\"\n";
    assert_eq!(parse(base).unwrap().final_shape(), None, "the tasks' own");
    let m = parse(&format!("{base}slots = 4\nmemory = \"16G\"\n")).unwrap();
    assert_eq!(
        m.final_shape(),
        Some(TaskShape {
            slots: 4,
            needs: Needs {
                memory_mb: 16384,
                gpus: 0
            }
        })
    );
    let err = parse(&format!("{base}slots = 0\n")).unwrap_err();
    assert_eq!(err.field(), Some("final.slots"));
    let err = parse(&format!("{base}gpus = 100\n")).unwrap_err();
    assert_eq!(err.field(), Some("final.gpus"));
    let err = parse(&format!("max_launchers = 2\n{base}slots = 4\n")).unwrap_err();
    assert_eq!(err.field(), Some("max_launchers"));
}

#[test]
fn bad_walltime_is_named() {
    let err = parse("name = \"a\"\nwalltime = \"ten minutes\"\n[[task]]\ncommand = \"true\"\n")
        .unwrap_err();
    assert!(err.to_string().contains("walltime"), "{err}");
    let err = parse("name = \"a\"\nwalltime = \"0s\"\n[[task]]\ncommand = \"true\"\n").unwrap_err();
    assert_eq!(err.field(), Some("walltime"));
}

#[test]
fn empty_job_and_empty_sweep_are_refused() {
    assert_eq!(parse("name = \"a\"\n").unwrap_err().field(), Some("task"));
    let err = parse("name = \"a\"\n[sweep]\ncommand = \"echo\"\nparams = {}\n").unwrap_err();
    assert_eq!(err.field(), Some("sweep.params"));
    let err =
        parse("name = \"a\"\n[sweep]\ncommand = \"echo {x}\"\nparams = { x = [] }\n").unwrap_err();
    assert_eq!(err.field(), Some("sweep.params.x"));
}

#[test]
fn bad_names_are_refused() {
    for name in ["", "has space", "slash/no", &"x".repeat(65)] {
        let text = format!("name = {name:?}\n[[task]]\ncommand = \"true\"\n");
        assert_eq!(parse(&text).unwrap_err().field(), Some("name"), "{name}");
    }
}

#[test]
fn moldable_components_need_a_speedup_that_reads() {
    let grid = |component: &str| {
        parse(&format!(
            "name = \"g\"\nkind = \"grid\"\nwalltime = \"1h\"\n[[component]]\ncommand = \"./mpi\"\n{component}"
        ))
    };
    let ok = grid("slots = { min = 4, max = 64 }\nspeedup = \"amdahl:0.95\"\n").unwrap();
    let moldable = ok.components[0].moldable(ok.walltime).unwrap();
    assert_eq!((moldable.min, moldable.max), (4, 64));
    let table =
        grid("slots = { min = 2, max = 8 }\nspeedup = { 2 = \"1h\", 8 = \"20m\" }\n").unwrap();
    assert_eq!(
        table.components[0].moldable(None).unwrap().at_most(7),
        Some(2)
    );
    for bad in [
        "slots = { min = 4, max = 64 }\n",
        "slots = { min = 4, max = 64 }\nspeedup = \"amdahl:2\"\n",
        "slots = 4\nspeedup = \"amdahl:0.9\"\n",
        "slots = { min = 8, max = 4 }\nspeedup = \"amdahl:0.9\"\n",
        "slots = { min = 2, max = 8 }\nspeedup = { 16 = \"1h\" }\n",
    ] {
        assert_eq!(
            grid(bad).unwrap_err().field(),
            Some("component[0].speedup"),
            "{bad}"
        );
    }
}

#[test]
fn grid_jobs_need_components_and_no_tasks() {
    let ok = parse(
            "name = \"g\"\nkind = \"grid\"\npriority = \"high\"\n[[component]]\nslots = 4\ncommand = \"./mpi\"\n",
        )
        .unwrap();
    assert_eq!(ok.effective_priority(), Priority::High);
    let err = parse("name = \"g\"\nkind = \"grid\"\n").unwrap_err();
    assert_eq!(err.field(), Some("component"));
    let err =
        parse("name = \"g\"\npriority = \"high\"\n[[task]]\ncommand = \"true\"\n").unwrap_err();
    assert_eq!(err.field(), Some("priority"));
    let err =
        parse("name = \"g\"\nkind = \"grid\"\n[[component]]\nslots = 0\ncommand = \"./mpi\"\n")
            .unwrap_err();
    assert_eq!(err.field(), Some("component[0].slots"));
}

#[test]
fn a_grid_jobs_barrier_and_claiming_threshold_are_bounded() {
    let grid = |extra: &str| {
        parse(&format!(
            "name = \"g\"\nkind = \"grid\"\n{extra}\n[[component]]\nslots = 1\ncommand = \"x\"\n"
        ))
    };
    let ok = grid("barrier_timeout = \"90s\"\nclaim_threshold = 0.5").unwrap();
    assert_eq!(
        (ok.barrier_timeout(), ok.claim_threshold()),
        (Duration::from_secs(90), 0.5)
    );
    let default = grid("").unwrap();
    assert_eq!(
        (default.barrier_timeout(), default.claim_threshold()),
        (DEFAULT_BARRIER_TIMEOUT, 1.0)
    );
    for (extra, field) in [
        ("barrier_timeout = \"0s\"", "barrier_timeout"),
        ("barrier_timeout = \"2days\"", "barrier_timeout"),
        ("claim_threshold = 0.0", "claim_threshold"),
        ("claim_threshold = 1.5", "claim_threshold"),
        ("claim_threshold = nan", "claim_threshold"),
    ] {
        assert_eq!(grid(extra).unwrap_err().field(), Some(field), "{extra}");
    }
    let err =
        parse("name = \"s\"\nclaim_threshold = 1.0\n[[task]]\ncommand = \"x\"\n").unwrap_err();
    assert_eq!(err.field(), Some("claim_threshold"));
    let inputs = parse(
            "name = \"g\"\nkind = \"grid\"\ninputs = [\"/data/a\"]\n[[component]]\nslots = 1\ncommand = \"x\"\ninputs = [\"/data/b\"]\n[[component]]\nslots = 1\ncommand = \"y\"\n",
        )
        .unwrap();
    assert_eq!(inputs.component_inputs(0), ["/data/a", "/data/b"]);
    assert_eq!(inputs.component_inputs(1), ["/data/a"]);
    for bad in ["\"data/a\"", "\"/data/../etc/shadow\"", "\"/a\\nb\""] {
        let err = grid(&format!("inputs = [{bad}]")).unwrap_err();
        assert_eq!(err.field(), Some("inputs"), "{bad}");
    }
}

#[test]
fn a_grid_job_has_a_bounded_number_of_components() {
    let grid = |components: usize| {
        let mut text = "name = \"g\"\nkind = \"grid\"\n".to_owned();
        for _ in 0..components {
            text.push_str("[[component]]\nslots = 1\ncommand = \"x\"\n");
        }
        parse(&text)
    };
    assert!(grid(MAX_COMPONENTS).is_ok());
    let err = grid(MAX_COMPONENTS + 1).unwrap_err();
    assert!(
        err.to_string().contains("more than 1024 components"),
        "{err}"
    );
}

#[test]
fn a_grid_jobs_inputs_are_bounded_as_each_component_holds_them() {
    // 1,000 inputs of 4,000 characters, read by each of 5 components.
    let inputs: Vec<String> = (0..1000)
        .map(|i| format!("/data/{i:04}/{}", "p".repeat(3990)))
        .collect();
    let text = |components: usize| {
        let mut text = format!("name = \"g\"\nkind = \"grid\"\ninputs = {inputs:?}\n");
        for _ in 0..components {
            text.push_str("[[component]]\nslots = 1\ncommand = \"x\"\n");
        }
        text
    };
    let one = parse(&text(1)).unwrap();
    assert!(one.input_copies_bytes() < MAX_INPUT_BYTES);
    let err = parse(&text(5)).unwrap_err();
    assert_eq!(err.field(), Some("inputs"), "{err}");
    assert!(err.to_string().contains("come to 19.1 MiB"), "{err}");
}

#[test]
fn outputs_must_stay_in_the_sandbox() {
    let err =
        parse("name = \"a\"\noutputs = [\"../x\"]\n[[task]]\ncommand = \"true\"\n").unwrap_err();
    assert_eq!(err.field(), Some("outputs[0]"));
}

#[test]
fn json_manifest_parses_and_keeps_parameter_order() {
    let m = Manifest::from_json(
        br#"{"name":"j","sweep":{"command":"run {b} {a}","params":{"b":[1,2],"a":["x","y","z"]}}}"#,
    )
    .unwrap();
    let tasks = TaskList::new(&m).unwrap();
    assert_eq!(tasks.get(0).unwrap().command, "run 1 x");
    assert_eq!(tasks.get(1).unwrap().command, "run 1 y");
    assert_eq!(tasks.get(3).unwrap().command, "run 2 x");
}

#[test]
fn json_errors_are_clear() {
    let err = Manifest::from_json(b"{\"name\": 3}").unwrap_err();
    assert!(err.to_string().contains("invalid JSON manifest"), "{err}");
}
