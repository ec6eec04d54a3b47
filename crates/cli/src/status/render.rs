//! The `kubectl get`-style tables of `tender status` (pure: rows in, text out).

use super::report::{BundleReport, WorkspaceReport};

/// Left-aligned columns separated by three spaces; the last column is not padded.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len() - 1;
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}   ", width = widths[i]));
            }
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
        out
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// A workspace as tables: HelmOps (when there are any), Bundles, then Clusters.
pub fn render_workspace_table(report: &WorkspaceReport) -> String {
    let helm_ops: Vec<Vec<String>> = report
        .helm_ops
        .iter()
        .map(|h| {
            vec![
                h.name.clone(),
                h.chart.clone(),
                h.version.clone(),
                h.clusters_ready.clone(),
                h.ready.clone(),
                h.reason.clone(),
                h.message.clone(),
            ]
        })
        .collect();
    let helm_ops = if helm_ops.is_empty() {
        String::new()
    } else {
        table(
            &[
                "HELMOP",
                "CHART",
                "VERSION",
                "CLUSTERS-READY",
                "READY",
                "REASON",
                "MESSAGE",
            ],
            &helm_ops,
        ) + "\n"
    };
    let bundles: Vec<Vec<String>> = report
        .bundles
        .iter()
        .map(|b| {
            vec![
                b.name.clone(),
                b.clusters_ready.clone(),
                b.ready.clone(),
                b.reason.clone(),
                b.message.clone(),
            ]
        })
        .collect();
    let clusters: Vec<Vec<String>> = report
        .clusters
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                c.mode.clone(),
                c.state.clone(),
                c.bundles_ready.clone(),
                c.namespace.clone(),
            ]
        })
        .collect();
    format!(
        "{helm_ops}{}\n{}",
        table(
            &["BUNDLE", "CLUSTERS-READY", "READY", "REASON", "MESSAGE"],
            &bundles
        ),
        table(
            &["CLUSTER", "MODE", "STATE", "BUNDLES-READY", "NAMESPACE"],
            &clusters
        )
    )
}

/// One Bundle: its summary line, then one line per targeted cluster.
pub fn render_bundle_table(report: &BundleReport) -> String {
    let b = &report.bundle;
    let mut out = format!(
        "Bundle {}/{}: {} clusters ready, Ready={}",
        report.workspace,
        b.name,
        if b.clusters_ready.is_empty() {
            "?"
        } else {
            &b.clusters_ready
        },
        b.ready
    );
    if !b.reason.is_empty() {
        out.push_str(&format!(" ({})", b.reason));
    }
    if !b.message.is_empty() {
        out.push_str(&format!(": {}", b.message));
    }
    out.push_str("\n\n");
    if report.clusters.is_empty() {
        out.push_str("No cluster is targeted (no BundleDeployment exists for this Bundle).\n");
        return out;
    }
    let rows: Vec<Vec<String>> = report
        .clusters
        .iter()
        .map(|t| {
            let mut row = vec![t.cluster.clone(), t.state.clone(), t.ready.clone()];
            // In waves, each cluster's wave and the revision it runs (a hash, never a value).
            if report.rollout.is_some() {
                row.push(t.wave.clone());
                row.push(t.revision.clone());
            }
            row.extend([t.reason.clone(), t.message.clone()]);
            row
        })
        .collect();
    let headers: &[&str] = if report.rollout.is_some() {
        &[
            "CLUSTER", "STATE", "READY", "WAVE", "REVISION", "REASON", "MESSAGE",
        ]
    } else {
        &["CLUSTER", "STATE", "READY", "REASON", "MESSAGE"]
    };
    out.push_str(&table(headers, &rows));
    if let Some(r) = &report.rollout {
        let rows: Vec<Vec<String>> = r
            .waves
            .iter()
            .enumerate()
            .map(|(i, w)| {
                vec![
                    (i + 1).to_string(),
                    w.name.clone(),
                    w.count.to_string(),
                    w.unavailable.clone(),
                    w.phase.clone(),
                ]
            })
            .collect();
        out.push_str("\nRollout waves:\n");
        out.push_str(&table(
            &["WAVE", "NAME", "CLUSTERS", "UNAVAILABLE/MAX", "PHASE"],
            &rows,
        ));
        for c in &r.conditions {
            out.push_str(&format!("{c}\n"));
        }
    }
    if !report.upstream.is_empty() {
        let rows: Vec<Vec<String>> = report
            .upstream
            .iter()
            .map(|u| {
                vec![
                    u.cluster.clone(),
                    u.object.clone(),
                    u.published.clone(),
                    u.state.clone(),
                    u.message.clone(),
                ]
            })
            .collect();
        out.push_str("\nPublished upstream (reverse sync):\n");
        out.push_str(&table(
            &["CLUSTER", "OBJECT", "PUBLISHED-AS", "STATE", "MESSAGE"],
            &rows,
        ));
    }
    out
}
