//! The layering holds: no crate of the workspace has an import cycle among its top-level
//! modules. Cargo already refuses a cycle between crates; inside a crate only this test
//! does. A module's dependencies are read from its code (comments and doc links do not
//! count): `crate::x`, `crate::{x, ..}`, `super::x` chains that climb to the crate root,
//! and names the crate root re-exports from a module (`crate::Host` is `host`).
//!
//! On failure it prints every cycle with a file and line for each arrow, so the fix is to
//! move what the lower module needs below it, not to hide the reference.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use quiver_tests::workspace;

/// Each crate's source root, by the crate's name.
const CRATES: [(&str, &str); 6] = [
    ("quiver", "host/runtime/src"),
    ("quiver-node", "host/node/src"),
    ("quiver-cli", "host/cli/src"),
    ("quiver-abi", "guest-sdk/abi/src"),
    ("quiver-guest", "guest-sdk/src"),
    ("quiver-tests", "tests/support"),
];

/// Where one module refers to another: the file and line, for the failure message.
type Evidence = (PathBuf, usize);

/// Top-level module → the modules it uses, with one place each use is made.
type Graph = BTreeMap<String, BTreeMap<String, Evidence>>;

#[test]
fn no_crate_has_an_import_cycle_among_its_top_level_modules() {
    let mut failures = Vec::new();
    for (name, root) in CRATES {
        let root = workspace().join(root);
        let graph = module_graph(&root);
        assert!(
            !graph.is_empty(),
            "{name}: no modules found under {}",
            root.display()
        );
        for component in strongly_connected(&graph).iter().filter(|c| c.len() > 1) {
            let arrows: Vec<String> = component
                .iter()
                .flat_map(|from| {
                    graph[from]
                        .iter()
                        .filter(|(to, _)| component.contains(*to))
                        .map(move |(to, (file, line))| {
                            format!("    {from} -> {to}   ({}:{line})", file.display())
                        })
                })
                .collect();
            failures.push(format!(
                "{name}: {component:?} reach each other; every arrow among them:\n{}",
                arrows.join("\n")
            ));
        }
        for cycle in cycles(&graph) {
            let arrows: Vec<String> = cycle
                .iter()
                .zip(cycle.iter().cycle().skip(1))
                .map(|(from, to)| {
                    let (file, line) = &graph[from][to];
                    format!("  {from} -> {to}   ({}:{line})", file.display())
                })
                .collect();
            failures.push(format!(
                "{name}: {}\n{}",
                cycle.join(" -> "),
                arrows.join("\n")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "import cycles between top-level modules (move what the lower module needs below \
         it):\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_checker_finds_a_cycle_and_reads_grouped_and_relative_paths() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\npub use b::Thing;\n").unwrap();
    std::fs::create_dir(src.join("a")).unwrap();
    std::fs::write(src.join("a/mod.rs"), "mod inner;\n").unwrap();
    std::fs::write(
        src.join("a/inner.rs"),
        "// crate::c is only a comment\nuse super::super::b::X;\n",
    )
    .unwrap();
    std::fs::write(src.join("b.rs"), "use crate::{c::Y, std_like};\n").unwrap();
    std::fs::write(src.join("c.rs"), "fn f() -> crate::Thing { todo!() }\n").unwrap();
    let graph = module_graph(src);
    let edges = |m: &str| graph[m].keys().cloned().collect::<Vec<_>>();
    assert_eq!(edges("a"), ["b"]);
    assert_eq!(edges("b"), ["c"]);
    assert_eq!(edges("c"), ["b"], "crate::Thing is b's re-export");
    assert_eq!(cycles(&graph), vec![vec!["b".to_owned(), "c".to_owned()]]);
}

/// The dependency graph of the crate whose source root is `src`.
fn module_graph(src: &Path) -> Graph {
    let modules = top_level_modules(src);
    let reexports = root_reexports(src, &modules);
    let mut graph = Graph::new();
    for module in &modules {
        let edges = graph.entry(module.clone()).or_default();
        for (file, depth) in module_files(src, module) {
            let text = std::fs::read_to_string(&file).unwrap();
            for (line_no, line) in code_lines(&text) {
                for target in referenced_modules(line, depth, &modules, &reexports) {
                    if target != *module {
                        edges.entry(target).or_insert((file.clone(), line_no));
                    }
                }
            }
        }
    }
    graph
}

/// `x` for every `x.rs` or `x/` beside the crate root (`lib.rs`/`main.rs`).
fn top_level_modules(src: &Path) -> BTreeSet<String> {
    std::fs::read_dir(src)
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let path = entry.path();
            let name = path.file_stem()?.to_str()?.to_owned();
            let is_module = path.is_dir() || path.extension().is_some_and(|e| e == "rs");
            (is_module && name != "lib" && name != "main").then_some(name)
        })
        .collect()
}

/// Names the crate root re-exports (`pub use x::{A, B}`), each mapped to its module `x`.
fn root_reexports(src: &Path, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let root = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .find(|p| p.exists())
        .expect("a crate root");
    let text = std::fs::read_to_string(root).unwrap();
    let mut names = BTreeMap::new();
    for statement in text.split(';') {
        let statement = statement.trim_start();
        let Some(path) = statement
            .strip_prefix("pub use ")
            .or_else(|| statement.strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        let path = path
            .trim()
            .trim_start_matches("crate::")
            .trim_start_matches("self::");
        let Some((module, rest)) = path.split_once("::") else {
            continue;
        };
        if !modules.contains(module) {
            continue;
        }
        let rest = rest.trim().trim_start_matches('{').trim_end_matches('}');
        for item in rest.split(',') {
            let last = item.split("::").last().unwrap_or("").trim();
            let name = last.rsplit(" as ").next().unwrap_or(last).trim();
            if !name.is_empty() && name != "self" && name != "*" {
                names.insert(name.to_owned(), module.to_owned());
            }
        }
    }
    names
}

/// Every file of `module` with its depth below the crate root (`x.rs`, `x/mod.rs`: 1).
fn module_files(src: &Path, module: &str) -> Vec<(PathBuf, usize)> {
    let mut files = Vec::new();
    let file = src.join(format!("{module}.rs"));
    if file.exists() {
        files.push((file, 1));
    }
    let dir = src.join(module);
    if dir.is_dir() {
        collect_rs(&dir, 1, &mut files);
    }
    files
}

fn collect_rs(dir: &Path, depth: usize, files: &mut Vec<(PathBuf, usize)>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_rs(&path, depth + 1, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            // `dir/mod.rs` is the module `dir` itself; `dir/x.rs` is one deeper.
            let file_depth = if stem == "mod" { depth } else { depth + 1 };
            files.push((path, file_depth));
        }
    }
}

/// Lines with their numbers, cut at a `//` comment (string contents are not code paths,
/// but a `//` inside a string only hides the rest of that line, which is harmless here).
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, line)| (i + 1, line.split("//").next().unwrap_or("")))
}

/// Top-level modules `line` refers to from a file `depth` levels below the crate root.
fn referenced_modules(
    line: &str,
    depth: usize,
    modules: &BTreeSet<String>,
    reexports: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut found = Vec::new();
    let mut push_first_segment = |path: &str| {
        let first: String = path
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if modules.contains(&first) {
            found.push(first);
        } else if let Some(module) = reexports.get(&first) {
            found.push(module.clone());
        }
    };
    let mut rest = line;
    while let Some(at) = find_path_start(rest) {
        let (prefix_len, is_root) = at.1;
        let after = &rest[at.0 + prefix_len..];
        if is_root {
            if let Some(group) = after.strip_prefix('{') {
                let group = group.split('}').next().unwrap_or("");
                group.split(',').for_each(&mut push_first_segment);
            } else {
                push_first_segment(after);
            }
        }
        rest = &rest[at.0 + prefix_len..];
    }
    // `super::` chains: climbing `depth` levels reaches the crate root.
    let mut rest = line;
    while let Some(at) = rest.find("super::") {
        let boundary_ok = at == 0 || !is_ident_char(rest[..at].chars().last().unwrap_or(' '));
        let mut after = &rest[at..];
        let mut climbs = 0;
        while let Some(next) = after.strip_prefix("super::") {
            climbs += 1;
            after = next;
        }
        if boundary_ok && climbs == depth {
            if let Some(group) = after.strip_prefix('{') {
                let group = group.split('}').next().unwrap_or("");
                group.split(',').for_each(&mut push_first_segment);
            } else {
                push_first_segment(after);
            }
        }
        rest = after;
    }
    found
}

/// The next `crate::` that starts a path (not `quiver_crate::`), as (offset, (length,
/// true)).
fn find_path_start(text: &str) -> Option<(usize, (usize, bool))> {
    let mut from = 0;
    while let Some(found) = text[from..].find("crate::") {
        let at = from + found;
        let before = text[..at].chars().last().unwrap_or(' ');
        if !is_ident_char(before) && before != ':' {
            return Some((at, ("crate::".len(), true)));
        }
        from = at + "crate::".len();
    }
    None
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every cycle of `graph`, one per strongly connected component of more than one module,
/// walked from its smallest module along the arrows.
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    let mut cycles = Vec::new();
    for component in strongly_connected(graph) {
        if component.len() < 2 {
            continue;
        }
        let start = component.iter().min().unwrap().clone();
        // A shortest way back to `start` inside the component (breadth-first).
        let mut came_from: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start.clone()]);
        let mut closing = None;
        while let Some(node) = queue.pop_front() {
            for next in graph[&node].keys().filter(|n| component.contains(*n)) {
                if *next == start {
                    closing = Some(node.clone());
                    break;
                }
                if !came_from.contains_key(next) {
                    came_from.insert(next.clone(), node.clone());
                    queue.push_back(next.clone());
                }
            }
            if closing.is_some() {
                break;
            }
        }
        let mut path = vec![closing.expect("a component of two or more has a cycle")];
        while let Some(prev) = came_from.get(path.last().unwrap()) {
            path.push(prev.clone());
        }
        if path.last() != Some(&start) {
            path.push(start);
        }
        path.reverse();
        cycles.push(path);
    }
    cycles
}

/// Tarjan's strongly connected components.
fn strongly_connected(graph: &Graph) -> Vec<BTreeSet<String>> {
    struct State<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        components: Vec<BTreeSet<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, node: &'g str) {
        let i = s.index.len();
        s.index.insert(node, i);
        s.low.insert(node, i);
        s.stack.push(node);
        s.on_stack.insert(node);
        let graph = s.graph;
        for next in graph[node].keys().filter(|n| graph.contains_key(*n)) {
            let next = next.as_str();
            if !s.index.contains_key(next) {
                visit(s, next);
                let low = s.low[node].min(s.low[next]);
                s.low.insert(node, low);
            } else if s.on_stack.contains(next) {
                let low = s.low[node].min(s.index[next]);
                s.low.insert(node, low);
            }
        }
        if s.low[node] == s.index[node] {
            let mut component = BTreeSet::new();
            while let Some(member) = s.stack.pop() {
                s.on_stack.remove(member);
                component.insert(member.to_owned());
                if member == node {
                    break;
                }
            }
            s.components.push(component);
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        components: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.components
}
