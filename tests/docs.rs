//! The documents as a reader follows them: README stays a front page (the
//! rest is the book under `docs/`), every chapter is in the book's table of
//! contents, and every link between the documents, and every part of
//! `DESIGN.md` the book includes, leads somewhere.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the gleaner crate sits in the workspace")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The book's chapters.
fn chapters() -> Vec<PathBuf> {
    let mut chapters: Vec<PathBuf> = std::fs::read_dir(root().join("docs/src"))
        .expect("docs/src")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    chapters.sort();
    chapters
}

/// Every inline link target in a Markdown text, outside code.
fn links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans hold no links.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            links.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    links
}

/// A heading's anchor as GitHub and mdBook make it.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut anchors = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            anchors.insert(slug(line.trim_start_matches('#')));
        }
    }
    anchors
}

fn broken_links(file: &Path) -> Vec<String> {
    let text = read(file);
    let dir = file.parent().expect("a document sits in a directory");
    links(&text)
        .into_iter()
        .filter(|link| !link.starts_with("http://") && !link.starts_with("https://"))
        .filter(|link| {
            let (path, anchor) = link.split_once('#').unwrap_or((link, ""));
            let target = if path.is_empty() {
                file.to_path_buf()
            } else {
                dir.join(path)
            };
            if !target.exists() {
                return true;
            }
            !anchor.is_empty() && !anchors(&read(&target)).contains(anchor)
        })
        .map(|link| format!("{}: {link}", file.display()))
        .collect()
}

#[test]
fn readme_is_a_front_page_and_the_rest_is_the_book() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines <= 150,
        "README.md has {lines} lines; the rest belongs in docs/"
    );
    let first = readme.lines().skip_while(|l| !l.starts_with("```")).nth(1);
    assert!(
        first.is_some_and(|l| l.starts_with("deploy/demo.sh")),
        "README's first command is deploy/demo.sh: {first:?}"
    );
}

#[test]
fn every_chapter_is_in_the_table_of_contents_and_every_entry_is_a_chapter() {
    let summary_path = root().join("docs/src/SUMMARY.md");
    let listed: BTreeSet<String> = links(&read(&summary_path)).into_iter().collect();
    let chapters: BTreeSet<String> = chapters()
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .filter(|name| name != "SUMMARY.md")
        .collect();
    assert_eq!(listed, chapters, "docs/src/SUMMARY.md against docs/src/");
}

#[test]
fn every_link_between_the_documents_leads_somewhere() {
    let mut files = vec![
        root().join("README.md"),
        root().join("DESIGN.md"),
        root().join("BENCHMARKS.md"),
    ];
    files.extend(chapters());
    let broken: Vec<String> = files.iter().flat_map(|f| broken_links(f)).collect();
    assert!(broken.is_empty(), "links that lead nowhere: {broken:#?}");
}

#[test]
fn what_the_book_includes_is_there() {
    let mut missing = Vec::new();
    for chapter in chapters() {
        let text = read(&chapter);
        for include in text.split("{{#include ").skip(1) {
            let Some(end) = include.find("}}") else {
                missing.push(format!("{}: an include without its end", chapter.display()));
                continue;
            };
            let (path, anchor) = include[..end]
                .trim()
                .split_once(':')
                .unwrap_or((include[..end].trim(), ""));
            let target = chapter.parent().expect("a chapter's directory").join(path);
            let Ok(included) = std::fs::read_to_string(&target) else {
                missing.push(format!("{}: {path}", chapter.display()));
                continue;
            };
            let opens = format!("ANCHOR: {anchor}");
            let closes = format!("ANCHOR_END: {anchor}");
            let marked = included.contains(&opens) && included.contains(&closes);
            if !anchor.is_empty() && !marked {
                missing.push(format!("{}: {path}:{anchor}", chapter.display()));
            }
        }
    }
    assert!(missing.is_empty(), "includes of nothing: {missing:#?}");
}
