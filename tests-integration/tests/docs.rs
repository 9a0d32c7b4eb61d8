//! The README and the pages under `docs/` as a newcomer uses them: every relative link
//! leads to a file (and a heading, when it names one), and every Rust example's
//! `[dependencies]` block names what the example needs: the paceline features its items
//! live behind, the crates it uses with the features it uses of them, and versions that
//! match the ones CI builds it against (this crate's manifest). The examples themselves
//! are compiled and run as doc tests (`src/lib.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The pages a user reads: the README, the docs, the benchmarks, the Python README.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![
        root.join("README.md"),
        root.join("BENCHMARKS.md"),
        root.join("CHANGELOG.md"),
        root.join("python/README.md"),
    ];
    for dir in ["docs", "docs/pictures", "python/docs"] {
        let mut found: Vec<_> = fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        found.sort();
        pages.extend(found);
    }
    pages
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.
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

/// A page's lines outside code blocks (their fences left out too).
fn prose(page: &str) -> impl Iterator<Item = &str> {
    let mut in_code = false;
    page.lines().filter(move |line| {
        if line.starts_with("```") {
            in_code = !in_code;
            return false;
        }
        !in_code
    })
}

/// The anchors of a page's headings (outside code blocks).
fn anchors(page: &str) -> BTreeSet<String> {
    prose(page)
        .filter(|line| line.starts_with('#'))
        .map(|line| slug(line.trim_start_matches('#')))
        .collect()
}

/// Every `](target)` of a page outside code blocks.
fn links(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(page) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
    out
}

#[test]
fn every_relative_link_leads_somewhere() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = fs::read_to_string(&page).unwrap();
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            let (file, anchor) = match link.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (link.as_str(), None),
            };
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !target.exists() {
                broken.push(format!("{}: {link}: no such file", page.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let ok = target.extension().is_some_and(|e| e == "md")
                    && anchors(&fs::read_to_string(&target).unwrap()).contains(anchor);
                if !ok {
                    broken.push(format!("{}: {link}: no such heading", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// A dependency as a `[dependencies]` line names it.
#[derive(Debug, Default)]
struct Dep {
    version: String,
    features: BTreeSet<String>,
}

/// The quoted strings of `s`, in order.
fn quoted(s: &str) -> Vec<String> {
    s.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The one-line entries (`name = "1"`, `name = { version = "1", features = [..] }`) of
/// the given section of a manifest (or of a whole block, `section == None`).
fn deps(toml: &str, sections: &[&str]) -> BTreeMap<String, Dep> {
    let mut out = BTreeMap::new();
    let mut current = String::new();
    for line in toml.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            current = line.trim_matches(['[', ']']).to_string();
            continue;
        }
        if !sections.contains(&current.as_str()) || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        let dep = if value.starts_with('"') {
            Dep {
                version: quoted(value)[0].clone(),
                ..Dep::default()
            }
        } else {
            // `key = ...`, not a longer key ending in it (`default-features`).
            let field = |key: &str| {
                value.match_indices(key).find_map(|(at, _)| {
                    let before = value[..at].chars().next_back();
                    let rest = value[at + key.len()..].trim_start();
                    (matches!(before, Some(' ' | '{')) && rest.starts_with('='))
                        .then(|| rest[1..].trim_start().to_string())
                })
            };
            Dep {
                version: field("version")
                    .map(|v| quoted(&v)[0].clone())
                    .unwrap_or_default(),
                features: field("features")
                    .map(|f| quoted(&f[..f.find(']').unwrap()]).into_iter().collect())
                    .unwrap_or_default(),
            }
        };
        out.insert(name.trim().to_string(), dep);
    }
    out
}

/// Cargo's caret key: the leading zeros and the first non-zero component.
fn caret(version: &str) -> Vec<&str> {
    let mut key = Vec::new();
    for part in version.split('.') {
        key.push(part);
        if part != "0" {
            break;
        }
    }
    key
}

/// paceline's features with everything they turn on.
fn feature_closure(wanted: &BTreeSet<String>) -> BTreeSet<String> {
    let manifest = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let mut table = BTreeMap::new();
    let mut in_features = false;
    for line in manifest.lines() {
        if line.starts_with('[') {
            in_features = line == "[features]";
        } else if in_features {
            if let Some((name, value)) = line.split_once('=') {
                table.insert(name.trim().to_string(), quoted(value));
            }
        }
    }
    let mut out = BTreeSet::from(["std".to_string()]);
    let mut todo: Vec<String> = wanted.iter().cloned().collect();
    while let Some(feature) = todo.pop() {
        assert!(
            table.contains_key(&feature),
            "paceline has no feature `{feature}`"
        );
        if out.insert(feature.clone()) || feature == "std" {
            for implied in &table[&feature] {
                if !implied.contains(':') && !implied.contains('/') {
                    todo.push(implied.clone());
                }
            }
        }
    }
    out
}

/// What an example needs, by what it uses: (a paceline feature, or a crate with the
/// feature it needs of it).
fn needs(
    code: &str,
) -> (
    BTreeSet<&'static str>,
    BTreeSet<(&'static str, Option<&'static str>)>,
) {
    let features = [
        ("paceline::http", "tower"),
        ("PaceMiddleware", "reqwest"),
        ("TokioClock", "tokio"),
        ("paceline::shared", "shared"),
        ("paceline::redis", "redis"),
        ("paceline::stream", "stream"),
        ("paceline::metrics", "metrics"),
        ("axum::", "axum"),
        ("tonic::", "tonic"),
    ];
    let crates = [
        ("#[tokio::main]", "tokio", Some("macros")),
        ("#[tokio::main]", "tokio", Some("rt-multi-thread")),
        ("tokio::net", "tokio", Some("net")),
        ("tokio::time", "tokio", Some("time")),
        ("axum::", "axum", None),
        ("tonic::", "tonic", None),
        ("reqwest::", "reqwest", None),
        ("reqwest_middleware::", "reqwest-middleware", None),
        ("futures::", "futures", None),
        ("hyper_util::", "hyper-util", None),
        ("http_body_util::", "http-body-util", None),
        ("bytes::", "bytes", None),
        ("tower::", "tower", None),
        ("redis::Client", "redis", None),
    ];
    let f = features
        .iter()
        .filter(|(use_, _)| code.contains(use_))
        .map(|&(_, f)| f)
        .collect();
    let c = crates
        .iter()
        .filter(|(use_, _, _)| code.contains(use_))
        .map(|&(_, name, feature)| (name, feature))
        .collect();
    (f, c)
}

#[test]
fn every_example_names_its_dependencies() {
    let root = root();
    let ours = deps(
        &fs::read_to_string(root.join("tests-integration/Cargo.toml")).unwrap(),
        &["dependencies", "dev-dependencies"],
    );
    let version = deps(
        &fs::read_to_string(root.join("Cargo.toml")).unwrap(),
        &["package"],
    )["version"]
        .version
        .clone();
    let mut wrong = Vec::new();
    let mut examples = 0;
    for page in pages() {
        let text = fs::read_to_string(&page).unwrap();
        let name = page.strip_prefix(&root).unwrap().display().to_string();
        let mut block: Option<(String, String)> = None; // (fence, text)
        let mut toml: Option<String> = None;
        for line in text.lines() {
            if let Some((fence, body)) = &mut block {
                if line == "```" {
                    let (fence, body) = block.take().unwrap();
                    if fence == "toml" && body.contains("[dependencies]") {
                        toml = Some(body);
                    } else if fence.starts_with("rust") && !fence.contains("ignore") {
                        examples += 1;
                        check(&name, &body, toml.as_deref(), &ours, &version, &mut wrong);
                    }
                } else {
                    let _ = fence;
                    body.push_str(line);
                    body.push('\n');
                }
            } else if let Some(fence) = line.strip_prefix("```") {
                block = Some((fence.to_string(), String::new()));
            }
        }
    }
    assert!(examples >= 10, "found only {examples} Rust examples");
    assert!(
        wrong.is_empty(),
        "examples whose dependencies are wrong:\n{}",
        wrong.join("\n")
    );
}

fn check(
    page: &str,
    code: &str,
    toml: Option<&str>,
    ours: &BTreeMap<String, Dep>,
    version: &str,
    wrong: &mut Vec<String>,
) {
    let first = code
        .lines()
        .find(|l| !l.starts_with('#'))
        .unwrap_or_default();
    let at = format!("{page}, the example starting `{first}`");
    let Some(toml) = toml else {
        wrong.push(format!("{at}: no [dependencies] block before it"));
        return;
    };
    let listed = deps(toml, &["dependencies"]);
    let Some(paceline) = listed.get("paceline") else {
        wrong.push(format!("{at}: its [dependencies] do not name paceline"));
        return;
    };
    if caret(&paceline.version) != caret(version) {
        wrong.push(format!(
            "{at}: paceline {} but the crate is {version}",
            paceline.version
        ));
    }
    let enabled = feature_closure(&paceline.features);
    let (features, crates) = needs(code);
    for feature in features {
        if !enabled.contains(feature) {
            wrong.push(format!(
                "{at}: uses what paceline's `{feature}` feature adds, not enabled"
            ));
        }
    }
    for (name, feature) in crates {
        let Some(dep) = listed.get(name) else {
            wrong.push(format!("{at}: uses `{name}`, not in its [dependencies]"));
            continue;
        };
        if let Some(feature) = feature {
            if !dep.features.contains(feature) {
                wrong.push(format!("{at}: needs {name}'s `{feature}` feature"));
            }
        }
    }
    for (name, dep) in &listed {
        if name == "paceline" {
            continue;
        }
        match ours.get(name) {
            None => wrong.push(format!(
                "{at}: `{name}` is not what CI builds the examples with"
            )),
            Some(built) if caret(&built.version) != caret(&dep.version) => wrong.push(format!(
                "{at}: {name} {} but CI builds the examples with {}",
                dep.version, built.version
            )),
            Some(_) => {}
        }
    }
}
