//! `dependsOn`: which Bundles of the workspace a Bundle waits for, and on which clusters it is
//! held back until they are in an accepted state there (decision 0097-depends-on-per-cluster).
//! Pure: the caller hands in the workspace's Bundles and, per dependency and cluster namespace,
//! the state of the dependency's BundleDeployment there.

use std::collections::{BTreeMap, BTreeSet};

use tender_types::conditions::reason;
use tender_types::targeting::selector_matches;
use tender_types::{BundleRef, BundleSpec, BundleState};

use super::plan::Plan;
use crate::summary::DeploymentState;

/// One Bundle of the workspace as dependency resolution sees it.
#[derive(Debug, Clone, Copy)]
pub struct Node<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its labels (what `selector` entries match).
    pub labels: &'a BTreeMap<String, String>,
    /// Its own `dependsOn`.
    pub depends_on: &'a [BundleRef],
}

/// What a Bundle's `dependsOn` resolves to.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// Each entry with the names of the Bundles it matched (none empty).
    Resolved(Vec<(BundleRef, Vec<String>)>),
    /// Entries matching no Bundle, as `name x` / `selector {...}`.
    NotFound(Vec<String>),
    /// A path from the Bundle back to itself: `[b, a, b]`.
    Cycle(Vec<String>),
    /// An entry's selector cannot be evaluated.
    InvalidSelector(String),
}

/// Whether `entry` selects Bundle `node` for the Bundle `me` (a selector never selects `me`
/// itself; a name does, which is a cycle).
fn selects(entry: &BundleRef, me: &str, node: &Node<'_>) -> Result<bool, String> {
    if let Some(name) = &entry.name
        && name != node.name
    {
        return Ok(false);
    }
    if entry.name.is_none() && node.name == me {
        return Ok(false);
    }
    match &entry.selector {
        None => Ok(true),
        Some(s) => selector_matches(s, node.labels).map_err(|e| e.to_string()),
    }
}

fn describe(entry: &BundleRef) -> String {
    match (&entry.name, &entry.selector) {
        (Some(n), None) => format!("name {n}"),
        (name, Some(s)) => {
            let sel = serde_json::to_string(s).unwrap_or_default();
            match name {
                Some(n) => format!("name {n} with selector {sel}"),
                None => format!("selector {sel}"),
            }
        }
        (None, None) => "an empty entry".to_string(),
    }
}

/// The Bundles `deps` select among `workspace`, for Bundle `me` (invalid selectors select none).
fn edges<'a>(me: &str, deps: &[BundleRef], workspace: &[Node<'a>]) -> BTreeSet<&'a str> {
    deps.iter()
        .flat_map(|e| {
            workspace
                .iter()
                .filter(move |n| selects(e, me, n).unwrap_or(false))
                .map(|n| n.name)
        })
        .collect()
}

/// Resolves the `dependsOn` of Bundle `me` (whose entries are `deps`) over the Bundles of its
/// workspace (`me` included).
pub fn resolve(me: &str, deps: &[BundleRef], workspace: &[Node<'_>]) -> Resolution {
    let mut resolved = Vec::new();
    let mut missing = Vec::new();
    for entry in deps {
        let mut names = Vec::new();
        for node in workspace {
            match selects(entry, me, node) {
                Ok(true) => names.push(node.name.to_string()),
                Ok(false) => {}
                Err(e) => return Resolution::InvalidSelector(format!("dependsOn: {e}")),
            }
        }
        if names.is_empty() {
            missing.push(describe(entry));
        } else {
            resolved.push((entry.clone(), names));
        }
    }
    if let Some(path) = cycle(me, deps, workspace) {
        return Resolution::Cycle(path);
    }
    if !missing.is_empty() {
        return Resolution::NotFound(missing);
    }
    Resolution::Resolved(resolved)
}

/// A shortest path of dependencies from `me` back to `me`, if there is one.
fn cycle(me: &str, deps: &[BundleRef], workspace: &[Node<'_>]) -> Option<Vec<String>> {
    let by_name: BTreeMap<&str, &Node<'_>> = workspace.iter().map(|n| (n.name, n)).collect();
    // Breadth first, remembering where each Bundle was reached from.
    let mut from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut frontier: Vec<&str> = Vec::new();
    for next in edges(me, deps, workspace) {
        from.entry(next).or_insert(me);
        frontier.push(next);
    }
    while !frontier.is_empty() {
        if from.contains_key(me) {
            break;
        }
        let mut following = Vec::new();
        for name in frontier {
            let Some(node) = by_name.get(name) else {
                continue;
            };
            for next in edges(name, node.depends_on, workspace) {
                if !from.contains_key(next) {
                    from.insert(next, name);
                    following.push(next);
                }
            }
        }
        frontier = following;
    }
    let mut at = *from.get(me)?;
    let mut path = vec![me.to_string()];
    while at != me {
        path.push(at.to_string());
        at = from[at];
    }
    path.push(me.to_string());
    path.reverse();
    Some(path)
}

/// A BundleDeployment's state in Fleet's words.
pub fn bundle_state(state: DeploymentState) -> BundleState {
    match state {
        DeploymentState::Pending => BundleState::Pending,
        DeploymentState::WaitApplied => BundleState::WaitApplied,
        DeploymentState::ErrApplied => BundleState::ErrApplied,
        DeploymentState::Modified => BundleState::Modified,
        DeploymentState::NotReady => BundleState::NotReady,
        DeploymentState::Ready => BundleState::Ready,
    }
}

/// What `dependsOn` did to a Bundle's plan, for its status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gate {
    /// The whole Bundle is held: reason word and message (a missing dependency, a cycle, an
    /// invalid selector).
    pub error: Option<(&'static str, String)>,
    /// Held clusters, each with what it waits for (`app-a: NotReady`), sorted by cluster.
    pub held: Vec<(String, String)>,
}

/// Holds back (nothing written, what exists stays) every deployment of `plan` whose cluster's
/// dependencies are not in an accepted state there. `state(dependency, cluster namespace)` is
/// the state of the dependency's BundleDeployment in that cluster namespace (`None`: it has
/// none there, which never satisfies a dependency).
pub fn gate(
    plan: &mut Plan,
    resolution: &Resolution,
    state: impl Fn(&str, &str) -> Option<BundleState>,
) -> Gate {
    let deps = match resolution {
        Resolution::Resolved(deps) => deps,
        other => {
            for d in &mut plan.deployments {
                d.spec = None;
                d.copies.clear();
            }
            let error = match other {
                Resolution::NotFound(missing) => (
                    reason::DEPENDENCY_NOT_FOUND,
                    format!(
                        "dependsOn matches no Bundle in this namespace: {}; nothing is written for this Bundle until it exists, what is deployed stays",
                        missing.join(", ")
                    ),
                ),
                Resolution::Cycle(path) => (
                    reason::DEPENDENCY_CYCLE,
                    format!(
                        "dependsOn is a cycle: {}; nothing is written for this Bundle until it is broken, what is deployed stays",
                        path.join(" -> ")
                    ),
                ),
                Resolution::InvalidSelector(e) => (reason::INVALID_SELECTOR, e.clone()),
                Resolution::Resolved(_) => unreachable!("matched above"),
            };
            return Gate {
                error: Some(error),
                held: Vec::new(),
            };
        }
    };
    let mut held = Vec::new();
    for d in &mut plan.deployments {
        if d.spec.is_none() {
            continue;
        }
        let waiting: Vec<String> = deps
            .iter()
            .flat_map(|(entry, names)| names.iter().map(move |n| (entry, n)))
            .filter_map(|(entry, n)| match state(n, &d.namespace) {
                Some(s) if entry.accepts(s) => None,
                Some(s) => Some(format!("{n}: {s:?}")),
                None => Some(format!("{n}: not deployed there")),
            })
            .collect();
        if !waiting.is_empty() {
            d.spec = None;
            d.copies.clear();
            held.push((d.cluster.clone(), waiting.join(", ")));
        }
    }
    held.sort();
    Gate { error: None, held }
}

/// Whether a change of Bundle `name` (labels `labels`, `None` when unknown) may concern a
/// Bundle with dependencies `spec` (over-approximated: an invalid selector counts).
pub fn may_depend_on(
    spec: &BundleSpec,
    name: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    spec.depends_on
        .iter()
        .any(|e| match (&e.name, &e.selector, labels) {
            (Some(n), _, _) if n != name => false,
            (_, Some(s), Some(l)) => selector_matches(s, l).unwrap_or(true),
            _ => true,
        })
}

/// The one-line summary of held clusters for the Bundle's Ready condition (at most 5 named).
pub fn held_message(held: &[(String, String)]) -> String {
    let shown: Vec<String> = held
        .iter()
        .take(5)
        .map(|(c, why)| format!("{c} ({why})"))
        .collect();
    let more = held.len().saturating_sub(shown.len());
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "{} clusters wait for their dependencies, keeping what they have: {}{tail}",
        held.len(),
        shown.join("; ")
    )
}

#[cfg(test)]
mod tests;
