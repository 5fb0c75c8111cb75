//! The shape of a crate's source, checked by `make lint`: the modules'
//! import graph, file by file, must have no cycle (a module that reaches
//! back to one that reaches it cannot be read, tested or moved alone), and
//! no source file may grow past [`MAX_SOURCE_LINES`] lines of non-test code.
//!
//! A module is a file (`mod x;`); an inline `mod x { … }` belongs to its
//! file. A file depends on another when it names something in it: through
//! `use`, a path in code (`crate::a::B`, `super::c`, `child::d`, a module
//! brought in by `use`), or such a path inside a macro's arguments. Code
//! under `#[cfg(test)]` is left out: tests may reach anywhere.
//!
//! The same holds one level up: a crate's top-level modules (each file or
//! folder under `src/` beside the root) are layers, and no two may reach
//! each other through any of their files ([`ModuleGraph::top_level`]). The
//! crate root is left out of that graph: it declares and re-exports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use syn::visit_mut::VisitMut;

/// Longest a source file may be, test modules left out.
pub const MAX_SOURCE_LINES: usize = 500;

/// One file module: its path in the crate (`["proxy", "route"]`; empty for
/// the crate root) and its file.
#[derive(Debug, Clone)]
pub struct Module {
    /// Path in the crate.
    pub path: Vec<String>,
    /// The file.
    pub file: PathBuf,
}

impl Module {
    /// `crate::a::b`, for messages.
    pub fn name(&self) -> String {
        std::iter::once("crate").chain(self.path.iter().map(String::as_str)).collect::<Vec<_>>().join("::")
    }
}

/// A crate's modules and who depends on whom, with the paths that make
/// each dependency (for messages).
#[derive(Debug, Default)]
pub struct ModuleGraph {
    /// Every file module, the root first.
    pub modules: Vec<Module>,
    /// `from → to → the paths in `from` that name something in `to``.
    pub edges: BTreeMap<usize, BTreeMap<usize, BTreeSet<String>>>,
}

impl ModuleGraph {
    /// Reads the crate whose root file (`lib.rs` or `main.rs`) is `root`.
    ///
    /// # Errors
    /// A file that cannot be read or parsed, or a `mod x;` without a file.
    pub fn read(root: &Path) -> anyhow::Result<Self> {
        let mut graph = Self::default();
        let mut parsed = Vec::new();
        let mut pending = vec![(Vec::new(), root.to_path_buf())];
        while let Some((path, file)) = pending.pop() {
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let mut syntax = syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))?;
            LeaveOutTests.visit_file_mut(&mut syntax);
            for child in file_modules(&syntax.items) {
                let child_file = child_file(&file, path.is_empty(), &child)?;
                let mut child_path = path.clone();
                child_path.push(child);
                pending.push((child_path, child_file));
            }
            graph.modules.push(Module { path, file });
            parsed.push(syntax);
        }
        let index: BTreeMap<Vec<String>, usize> =
            graph.modules.iter().enumerate().map(|(i, module)| (module.path.clone(), i)).collect();
        for (from, syntax) in parsed.iter_mut().enumerate() {
            let here = graph.modules[from].path.clone();
            let mut names = Names::default();
            names.visit_file_mut(syntax);
            let resolver = Resolver { here: &here, modules: &index, aliases: aliases(&here, &names.uses, &index) };
            for path in names.uses.iter().chain(&names.paths) {
                if let Some(to) = resolver.target(path)
                    && to != from
                {
                    graph.edges.entry(from).or_default().entry(to).or_default().insert(path.join("::"));
                }
            }
        }
        Ok(graph)
    }

    /// The cycles: each set of two or more modules that reach each other,
    /// as module indices, smallest first.
    pub fn cycles(&self) -> Vec<Vec<usize>> {
        strongly_connected(self.modules.len(), |from| {
            self.edges.get(&from).map(|targets| targets.keys().copied().collect()).unwrap_or_default()
        })
        .into_iter()
        .filter(|component| component.len() > 1)
        .collect()
    }

    /// The graph one level up: one node per top-level module (`crate::a`
    /// stands for `a.rs` or `a/` and every file under it), an edge from `a`
    /// to `b` when any file in `a` names something in `b`. The root is left
    /// out.
    pub fn top_level(&self) -> Self {
        let mut graph = Self::default();
        let mut index = BTreeMap::new();
        let mut layer = |module: &Module, graph: &mut Self| {
            let first = module.path.first()?.clone();
            Some(*index.entry(first.clone()).or_insert_with(|| {
                graph.modules.push(Module { path: vec![first], file: module.file.clone() });
                graph.modules.len() - 1
            }))
        };
        // Parents come before their children in `modules`, so each layer's
        // file is its top-level file.
        let layers: Vec<Option<usize>> = self.modules.iter().map(|module| layer(module, &mut graph)).collect();
        for (from, targets) in &self.edges {
            for (to, paths) in targets {
                if let (Some(a), Some(b)) = (layers[*from], layers[*to])
                    && a != b
                {
                    graph.edges.entry(a).or_default().entry(b).or_default().extend(paths.iter().cloned());
                }
            }
        }
        graph
    }

    /// A readable account of `cycle`: each dependency inside it, with the
    /// paths that make it.
    pub fn describe(&self, cycle: &[usize]) -> String {
        let members: BTreeSet<usize> = cycle.iter().copied().collect();
        let mut lines = vec![format!("a cycle of {} modules:", cycle.len())];
        for &from in cycle {
            for (to, paths) in self.edges.get(&from).into_iter().flatten() {
                if members.contains(to) {
                    let shown: Vec<&str> = paths.iter().map(String::as_str).take(3).collect();
                    lines.push(format!(
                        "  {} → {} ({})",
                        self.modules[from].name(),
                        self.modules[*to].name(),
                        shown.join(", ")
                    ));
                }
            }
        }
        lines.join("\n")
    }
}

/// Lines of a source file before its first `#[cfg(test)]` module.
pub fn source_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let test_module = lines.windows(2).position(|pair| pair[0].trim() == "#[cfg(test)]" && pair[1].starts_with("mod "));
    test_module.unwrap_or(lines.len())
}

/// Every problem in the crate rooted at `root`: cycles between files or
/// between top-level modules, and files over
/// [`MAX_SOURCE_LINES`] (files named `tests.rs` or `*_tests.rs` are tests).
///
/// # Errors
/// As [`ModuleGraph::read`].
pub fn problems(root: &Path) -> anyhow::Result<Vec<String>> {
    let graph = ModuleGraph::read(root)?;
    let mut found: Vec<String> = graph.cycles().iter().map(|cycle| graph.describe(cycle)).collect();
    let layers = graph.top_level();
    found.extend(layers.cycles().iter().map(|cycle| format!("between top-level modules, {}", layers.describe(cycle))));
    for module in &graph.modules {
        let name = module.file.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&module.file)?;
        let lines = source_lines(&text);
        if lines > MAX_SOURCE_LINES {
            found.push(format!(
                "{}: {lines} lines of non-test code (at most {MAX_SOURCE_LINES})",
                module.file.display()
            ));
        }
    }
    Ok(found)
}

fn is_test_only(attributes: &[syn::Attribute]) -> bool {
    attributes.iter().any(|attribute| {
        attribute.path().is_ident("cfg")
            && attribute.parse_args::<syn::Meta>().is_ok_and(|meta| meta.path().is_ident("test"))
    })
}

fn item_attributes(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// Removes every item (and impl item) under `#[cfg(test)]`.
struct LeaveOutTests;

impl VisitMut for LeaveOutTests {
    fn visit_file_mut(&mut self, file: &mut syn::File) {
        file.items.retain(|item| !is_test_only(item_attributes(item)));
        syn::visit_mut::visit_file_mut(self, file);
    }

    fn visit_item_mod_mut(&mut self, module: &mut syn::ItemMod) {
        if let Some((_, items)) = &mut module.content {
            items.retain(|item| !is_test_only(item_attributes(item)));
        }
        syn::visit_mut::visit_item_mod_mut(self, module);
    }

    fn visit_item_impl_mut(&mut self, block: &mut syn::ItemImpl) {
        block.items.retain(|item| match item {
            syn::ImplItem::Fn(f) => !is_test_only(&f.attrs),
            syn::ImplItem::Const(c) => !is_test_only(&c.attrs),
            _ => true,
        });
        syn::visit_mut::visit_item_impl_mut(self, block);
    }

    fn visit_block_mut(&mut self, block: &mut syn::Block) {
        block.stmts.retain(|statement| match statement {
            syn::Stmt::Item(item) => !is_test_only(item_attributes(item)),
            _ => true,
        });
        syn::visit_mut::visit_block_mut(self, block);
    }
}

/// The `mod x;` declarations (file modules) among `items`.
fn file_modules(items: &[syn::Item]) -> Vec<String> {
    items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Mod(module) if module.content.is_none() => Some(module.ident.to_string()),
            _ => None,
        })
        .collect()
}

/// Where `mod name;` in `file` lives: beside a crate root or `mod.rs`, in
/// a folder named after any other file.
fn child_file(file: &Path, is_root: bool, name: &str) -> anyhow::Result<PathBuf> {
    let parent = file.parent().unwrap_or(Path::new("."));
    let folder = if is_root || file.file_name().is_some_and(|n| n == "mod.rs") {
        parent.to_path_buf()
    } else {
        parent.join(file.file_stem().unwrap_or_default())
    };
    [folder.join(format!("{name}.rs")), folder.join(name).join("mod.rs")]
        .into_iter()
        .find(|candidate| candidate.is_file())
        .with_context(|| format!("{}: no file for `mod {name};`", file.display()))
}

/// Every path a file names: `use` trees expanded into their leaves, paths
/// of two or more segments in code, and `crate::`/`super::`/`self::` paths
/// inside macro arguments.
#[derive(Default)]
struct Names {
    uses: Vec<Vec<String>>,
    paths: Vec<Vec<String>>,
}

impl VisitMut for Names {
    fn visit_item_use_mut(&mut self, item: &mut syn::ItemUse) {
        expand_use(&item.tree, &mut Vec::new(), &mut self.uses);
    }

    fn visit_path_mut(&mut self, path: &mut syn::Path) {
        if path.segments.len() >= 2 {
            self.paths.push(path.segments.iter().map(|segment| segment.ident.to_string()).collect());
        }
        syn::visit_mut::visit_path_mut(self, path);
    }

    fn visit_macro_mut(&mut self, mac: &mut syn::Macro) {
        paths_in_tokens(mac.tokens.clone(), &mut self.paths);
        syn::visit_mut::visit_macro_mut(self, mac);
    }
}

fn expand_use(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(path) => {
            prefix.push(path.ident.to_string());
            expand_use(&path.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(name) if name.ident == "self" => out.push(prefix.clone()),
        syn::UseTree::Name(name) => out.push(prefix.iter().cloned().chain([name.ident.to_string()]).collect()),
        syn::UseTree::Rename(rename) => out.push(prefix.iter().cloned().chain([rename.ident.to_string()]).collect()),
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(group) => group.items.iter().for_each(|tree| expand_use(tree, prefix, out)),
    }
}

/// `crate :: a :: b`, `super :: c` and `self :: d` sequences in a macro's
/// tokens (macro arguments are not parsed as code).
fn paths_in_tokens(tokens: proc_macro2::TokenStream, out: &mut Vec<Vec<String>>) {
    let mut current: Vec<String> = Vec::new();
    let mut after_colons = false;
    let mut colons = 0;
    let flush = |current: &mut Vec<String>, out: &mut Vec<Vec<String>>| {
        if current.len() >= 2 && matches!(current[0].as_str(), "crate" | "super" | "self") {
            out.push(std::mem::take(current));
        }
        current.clear();
    };
    for token in tokens {
        match token {
            proc_macro2::TokenTree::Group(group) => {
                flush(&mut current, out);
                paths_in_tokens(group.stream(), out);
                after_colons = false;
            }
            proc_macro2::TokenTree::Ident(ident) => {
                if !after_colons {
                    flush(&mut current, out);
                }
                current.push(ident.to_string());
                after_colons = false;
                colons = 0;
            }
            proc_macro2::TokenTree::Punct(punct) if punct.as_char() == ':' && !current.is_empty() => {
                colons += 1;
                after_colons = colons == 2;
            }
            _ => {
                flush(&mut current, out);
                after_colons = false;
                colons = 0;
            }
        }
    }
    flush(&mut current, out);
}

/// Names a file brought in by `use` that are modules (`use crate::upstream;`
/// then `upstream::pick::x`), with the module each stands for.
fn aliases(
    here: &[String],
    uses: &[Vec<String>],
    modules: &BTreeMap<Vec<String>, usize>,
) -> BTreeMap<String, Vec<String>> {
    let bare = Resolver { here, modules, aliases: BTreeMap::new() };
    uses.iter()
        .filter_map(|path| {
            let absolute = bare.absolute(path)?;
            let name = path.last()?.clone();
            modules.contains_key(&absolute).then_some((name, absolute))
        })
        .collect()
}

struct Resolver<'a> {
    here: &'a [String],
    modules: &'a BTreeMap<Vec<String>, usize>,
    aliases: BTreeMap<String, Vec<String>>,
}

impl Resolver<'_> {
    /// `path` from the crate root, when it starts at this crate (`crate`,
    /// `super`, `self`, a child module or a module brought in by `use`).
    fn absolute(&self, path: &[String]) -> Option<Vec<String>> {
        let (first, rest) = path.split_first()?;
        let mut base: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.here.to_vec(),
            "super" => {
                let mut base = self.here.to_vec();
                base.pop();
                let mut rest = rest;
                while let Some((next, after)) = rest.split_first()
                    && next == "super"
                {
                    base.pop();
                    rest = after;
                }
                return Some(base.into_iter().chain(rest.iter().cloned()).collect());
            }
            _ => {
                let mut child = self.here.to_vec();
                child.push(first.clone());
                if self.modules.contains_key(&child) {
                    child.pop();
                    child
                } else if let Some(module) = self.aliases.get(first) {
                    return Some(module.iter().chain(rest).cloned().collect());
                } else {
                    return None;
                }
            }
        };
        if first != "crate" && first != "self" {
            base.push(first.clone());
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The file module `path` lands in: the longest prefix that is one.
    fn target(&self, path: &[String]) -> Option<usize> {
        let mut absolute = self.absolute(path)?;
        loop {
            if let Some(index) = self.modules.get(&absolute) {
                return Some(*index);
            }
            absolute.pop()?;
        }
    }
}

/// Tarjan's strongly connected components over nodes `0..count`.
fn strongly_connected(count: usize, successors: impl Fn(usize) -> Vec<usize>) -> Vec<Vec<usize>> {
    struct State {
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        found: Vec<Vec<usize>>,
    }
    fn visit(node: usize, state: &mut State, successors: &dyn Fn(usize) -> Vec<usize>) {
        state.index[node] = Some(state.next);
        state.low[node] = state.next;
        state.next += 1;
        state.stack.push(node);
        state.on_stack[node] = true;
        for next in successors(node) {
            match state.index[next] {
                None => {
                    visit(next, state, successors);
                    state.low[node] = state.low[node].min(state.low[next]);
                }
                Some(index) if state.on_stack[next] => state.low[node] = state.low[node].min(index),
                Some(_) => {}
            }
        }
        if Some(state.low[node]) == state.index[node] {
            let mut component = Vec::new();
            while let Some(member) = state.stack.pop() {
                state.on_stack[member] = false;
                component.push(member);
                if member == node {
                    break;
                }
            }
            component.sort_unstable();
            state.found.push(component);
        }
    }
    let mut state = State {
        index: vec![None; count],
        low: vec![0; count],
        on_stack: vec![false; count],
        stack: Vec::new(),
        next: 0,
        found: Vec::new(),
    };
    for node in 0..count {
        if state.index[node].is_none() {
            visit(node, &mut state, &successors);
        }
    }
    state.found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("waycast-structure-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_module_that_reaches_back_is_a_cycle_and_tests_do_not_count() {
        let dir = scratch("cycle");
        write(
            &dir,
            &[
                ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
                ("a.rs", "use crate::b::Thing;\npub struct Root;\n"),
                // b reaches a only inside a macro's arguments.
                ("b.rs", "pub struct Thing;\nfn f() { let _ = format!(\"{}\", crate::a::Root); }\n"),
                ("c.rs", "pub fn g() {}\n#[cfg(test)]\nmod tests { use crate::a::Root; }\n"),
            ],
        );
        let graph = ModuleGraph::read(&dir.join("lib.rs")).unwrap();
        let cycles = graph.cycles();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        let names: Vec<String> = cycles[0].iter().map(|&m| graph.modules[m].name()).collect();
        assert_eq!(names.len(), 2);
        assert!(names.contains(&"crate::a".to_owned()) && names.contains(&"crate::b".to_owned()), "{names:?}");
        assert!(graph.describe(&cycles[0]).contains("crate::a::Root"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn relative_paths_resolve_through_children_super_and_use() {
        let dir = scratch("relative");
        write(
            &dir,
            &[
                ("lib.rs", "mod outer;\nmod leaf;\n"),
                ("outer/mod.rs", "mod inner;\nfn f() { inner::go(); }\n"),
                // A child that names its parent through `super`, and a module
                // brought in by `use` and then named by a path.
                ("outer/inner.rs", "use crate::leaf;\npub fn go() { super::f(); leaf::x(); }\n"),
                ("leaf.rs", "pub fn x() {}\n"),
            ],
        );
        let graph = ModuleGraph::read(&dir.join("lib.rs")).unwrap();
        let edge = |from: &str, to: &str| {
            let find = |name: &str| graph.modules.iter().position(|m| m.name() == name).unwrap();
            graph.edges.get(&find(from)).is_some_and(|targets| targets.contains_key(&find(to)))
        };
        assert!(edge("crate::outer", "crate::outer::inner"));
        assert!(edge("crate::outer::inner", "crate::outer"));
        assert!(edge("crate::outer::inner", "crate::leaf"));
        assert!(!edge("crate::leaf", "crate::outer"));
        assert_eq!(graph.cycles().len(), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn top_level_modules_that_reach_each_other_through_different_files_are_a_cycle() {
        let dir = scratch("layers");
        write(
            &dir,
            &[
                ("lib.rs", "mod config_plan;\nmod render;\nmod leaf;\npub struct Root;\n"),
                // config_plan → render::meta; render::settings → config_plan:
                // no two files reach each other, the two modules do.
                ("config_plan.rs", "use crate::render::meta::name;\npub struct Plan;\n"),
                ("render/mod.rs", "pub mod meta;\nmod settings;\nfn f() { settings::g(); }\n"),
                ("render/meta.rs", "pub fn name() { crate::leaf::x(); }\n"),
                ("render/settings.rs", "pub fn g() { let _ = super::super::config_plan::Plan; }\n"),
                // Reaching the root does not tie a module to the others.
                ("leaf.rs", "pub fn x() { let _ = crate::Root; }\n"),
            ],
        );
        let root = dir.join("lib.rs");
        let graph = ModuleGraph::read(&root).unwrap();
        assert!(graph.cycles().is_empty(), "no cycle between files: {:?}", graph.cycles());
        let layers = graph.top_level();
        let names: Vec<String> = layers.modules.iter().map(Module::name).collect();
        assert_eq!(names.len(), 3, "{names:?}");
        let cycles = layers.cycles();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        let members: BTreeSet<String> = cycles[0].iter().map(|&m| layers.modules[m].name()).collect();
        assert_eq!(members, BTreeSet::from(["crate::config_plan".to_owned(), "crate::render".to_owned()]));
        let found = problems(&root).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("between top-level modules"), "{found:?}");
        assert!(found[0].contains("crate::render → crate::config_plan (super::super::config_plan::Plan)"), "{found:?}");
        assert!(found[0].contains("crate::config_plan → crate::render (crate::render::meta::name)"), "{found:?}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn test_modules_do_not_count_towards_a_files_length() {
        let text = "fn a() {}\nfn b() {}\n#[cfg(test)]\nmod tests {\n}\n";
        assert_eq!(source_lines(text), 2);
        assert_eq!(source_lines("fn a() {}\n"), 1);
    }
}
