//! `docs/abi.md` and `wit/spear.wit` state the ABI for people and tools; these tests keep
//! them equal to the crate, which is what the host and the SDKs compile against.

use std::path::PathBuf;

use quiver_abi::{Errno, IMPORTS, ValType, ctl, epoll_events, epoll_op, fd_ctl, send_flags};

fn workspace_file(path: &str) -> String {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// The rows (cells trimmed, header and separator dropped) of every markdown table whose
/// header row starts with `header`.
fn table_rows(markdown: &str, header: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut inside = false;
    for line in markdown.lines() {
        let line = line.trim();
        if !line.starts_with('|') {
            inside = false;
            continue;
        }
        let cells: Vec<String> = line
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().trim_matches('`').to_owned())
            .collect();
        if line.starts_with(header) {
            inside = true;
        } else if inside && !cells[0].starts_with("---") {
            rows.push(cells);
        }
    }
    rows
}

#[test]
fn the_errno_table_of_the_docs_is_the_crates() {
    let docs = workspace_file("docs/abi.md");
    let rows = table_rows(&docs, "| errno | value |");
    let documented: Vec<(String, i32, String)> = rows
        .iter()
        .map(|r| {
            (
                r[0].clone(),
                r[1].parse().expect("errno value"),
                r[2].clone(),
            )
        })
        .collect();
    let defined: Vec<(String, i32, String)> = Errno::ALL
        .iter()
        .map(|e| {
            let name = e.name().expect("defined errnos have names");
            (name.to_owned(), e.raw(), e.meaning().unwrap().to_owned())
        })
        .collect();
    assert_eq!(documented, defined);
}

#[test]
fn every_import_is_documented_with_its_parameters() {
    let docs = workspace_file("docs/abi.md");
    let rows = table_rows(&docs, "| function | signature |");
    let documented: Vec<(String, Vec<String>, bool)> = rows
        .iter()
        .map(|r| {
            let signature = &r[1];
            let params = signature[signature.find('(').unwrap() + 1..signature.find(')').unwrap()]
                .split(',')
                .map(|p| p.trim().to_owned())
                .filter(|p| !p.is_empty())
                .collect();
            (r[0].clone(), params, signature.contains("-> i64"))
        })
        .collect();
    let defined: Vec<(String, Vec<String>, bool)> = IMPORTS
        .iter()
        .map(|i| {
            let params = i.params.iter().map(|p| p.to_string()).collect();
            (i.name.to_owned(), params, i.result == Some(ValType::I64))
        })
        .collect();
    assert_eq!(documented, defined);
}

#[test]
fn ctl_commands_and_send_flags_are_documented() {
    let docs = workspace_file("docs/abi.md");
    let pairs = |header: &str| -> Vec<(i32, String)> {
        table_rows(&docs, header)
            .iter()
            .map(|r| (r[0].parse().expect("a number"), r[1].clone()))
            .collect()
    };
    let defined = |all: &[quiver_abi::Named]| -> Vec<(i32, String)> {
        all.iter().map(|n| (n.value, n.name.to_owned())).collect()
    };
    assert_eq!(pairs("| cmd | name |"), defined(ctl::ALL));
    assert_eq!(pairs("| flag | name |"), defined(send_flags::ALL));
    assert_eq!(pairs("| op | name |"), defined(epoll_op::ALL));
    assert_eq!(pairs("| bit | name |"), defined(epoll_events::ALL));
    assert_eq!(pairs("| fd_ctl cmd | name |"), defined(fd_ctl::ALL));
}

#[test]
fn the_wit_declares_every_import_and_number() {
    let wit = workspace_file("wit/spear.wit");
    for import in IMPORTS {
        let name = format!("{}: func(", import.name.replace('_', "-"));
        assert!(wit.contains(&name), "wit/spear.wit lacks `{name}`");
    }
    let declared = wit.matches(": func(").count();
    assert_eq!(
        declared,
        IMPORTS.len(),
        "wit/spear.wit declares other functions"
    );
    let ctl_line = wit
        .lines()
        .find(|l| l.contains("SET_PARAM"))
        .expect("ctl doc line");
    for command in ctl::ALL {
        let pair = format!("{} {}", command.value, command.name);
        assert!(
            ctl_line.contains(&pair),
            "wit's cchat-ctl doc lacks `{pair}`"
        );
    }
    let flags_line = wit
        .lines()
        .find(|l| l.contains("flags:"))
        .expect("flags doc line");
    for flag in send_flags::ALL {
        let pair = format!("{} {}", flag.value, flag.name);
        assert!(
            flags_line.contains(&pair),
            "wit's cchat-send doc lacks `{pair}`"
        );
    }
}
