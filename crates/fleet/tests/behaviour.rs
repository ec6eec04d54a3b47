//! Conversion rules checked on small directories written by the test: names, .fleetignore,
//! targets files and their restrictions, the size limit and compression.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tender_fleet::{Error, Options, convert};

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("tender-fleet-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }
    fn write(&self, rel: &str, text: &str) -> &Self {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
        self
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n";

fn bundles(dir: &Path, opts: &Options) -> Vec<Value> {
    convert(&[dir.to_path_buf()], opts)
        .unwrap()
        .into_iter()
        .flat_map(|c| c.bundles)
        .map(|b| serde_json::to_value(b).unwrap())
        .collect()
}

fn refused(dir: &Path, opts: &Options) -> Vec<String> {
    match convert(&[dir.to_path_buf()], opts) {
        Err(Error::Refused(r)) => r.into_iter().map(|r| r.path).collect(),
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn fleet_yaml_name_wins_and_name_prefixes_the_path() {
    let d = Dir::new("names");
    d.write("app/fleet.yaml", "{}").write("app/cm.yaml", CM);
    d.write("named/fleet.yaml", "name: mine\nlabels: {x: z}\n")
        .write("named/cm.yaml", CM);
    let opts = Options {
        name: Some("repo".into()),
        ..Options::default()
    };
    let b = bundles(&d.0, &opts);
    let names: Vec<&str> = b
        .iter()
        .map(|b| b["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2);
    assert!(
        names[0].starts_with("repo-") && names[0].ends_with("-app"),
        "{names:?}"
    );
    assert_eq!(names[1], "mine");
    assert_eq!(b[1]["metadata"]["labels"]["x"], "z");
}

#[test]
fn fleetignore_and_dot_files_are_left_out() {
    let d = Dir::new("ignore");
    d.write("fleet.yaml", "{}")
        .write("cm.yaml", CM)
        .write(".fleetignore", "skip-*.yaml\nsub/*\n")
        .write("skip-me.yaml", "not: an object")
        .write("sub/x.yaml", "not: an object")
        .write(".hidden/x.yaml", "not: an object");
    let b = bundles(&d.0, &Options::default());
    assert_eq!(b[0]["spec"]["resources"].as_array().unwrap().len(), 1);
    assert_eq!(b[0]["spec"]["targets"][0]["clusterGroup"], "default");
}

#[test]
fn a_targets_file_appends_and_its_restrictions_must_not_narrow() {
    let d = Dir::new("targets");
    d.write("app/fleet.yaml", "targetCustomizations:\n- name: dev\n  clusterSelector: {matchLabels: {env: dev}}\n  helm: {values: {a: 1}}\n")
        .write("app/cm.yaml", CM)
        .write("open.yaml", "targets:\n- clusterSelector: {}\ntargetRestrictions:\n- clusterSelector: {}\n")
        .write("narrow.yaml", "targets:\n- clusterGroup: g\ntargetRestrictions:\n- clusterGroup: g\n")
        .write("gitrepo-default.yaml", "targets:\n- clusterGroup: default\ntargetRestrictions:\n- clusterGroup: default\n");
    let app = d.0.join("app");
    let open = Options {
        targets_file: Some(d.0.join("open.yaml")),
        ..Options::default()
    };
    let b = bundles(&app, &open);
    let targets = b[0]["spec"]["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 2);
    assert_eq!(targets[0]["name"], "dev");
    assert_eq!(targets[1]["clusterSelector"], serde_json::json!({}));
    let narrow = Options {
        targets_file: Some(d.0.join("narrow.yaml")),
        ..Options::default()
    };
    assert_eq!(refused(&app, &narrow), ["targetCustomizations[0]"]);
    // A GitRepo without targets: Fleet's `default` group, every cluster.
    let gitrepo = Options {
        targets_file: Some(d.0.join("gitrepo-default.yaml")),
        ..Options::default()
    };
    let b = bundles(&app, &gitrepo);
    assert_eq!(b[0]["spec"]["targets"][1]["clusterGroup"], "default");
}

#[test]
fn a_big_chart_is_compressed_and_a_bigger_one_refused() {
    let d = Dir::new("size");
    d.write("fleet.yaml", "helm:\n  chart: chart\n")
        .write(
            "chart/Chart.yaml",
            "apiVersion: v2\nname: c\nversion: 0.1.0\n",
        )
        .write(
            "chart/templates/big.yaml",
            &format!("# {}\n", "x".repeat(1_200_000)),
        );
    let b = bundles(&d.0, &Options::default());
    let files = b[0]["spec"]["resources"].as_array().unwrap();
    assert!(
        files.iter().all(|f| f["encoding"] == "base64+gz"),
        "{files:?}"
    );
    assert!(serde_json::to_vec(&b[0]).unwrap().len() < tender_fleet::MAX_BUNDLE_BYTES);
    // Incompressible: pseudo-random text.
    let mut x: u64 = 1;
    let noise: String = (0..1_500_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'!' + (x % 90) as u8)
        })
        .collect();
    d.write("chart/templates/big.yaml", &format!("# {noise}\n"));
    assert_eq!(refused(&d.0, &Options::default()), ["(whole directory)"]);
}

#[test]
fn values_files_merge_over_values_in_order_and_are_not_carried() {
    let d = Dir::new("values");
    d.write("fleet.yaml", "helm:\n  chart: chart\n  values: {a: {x: 1, y: 1}, b: 1}\n  valuesFiles: [v1.yaml, ./v2.yaml]\n")
        .write("v1.yaml", "a: {y: 2}\nc: 1\n")
        .write("v2.yaml", "c: 2\n")
        .write("chart/Chart.yaml", "apiVersion: v2\nname: c\nversion: 0.1.0\n");
    let b = bundles(&d.0, &Options::default());
    assert_eq!(
        b[0]["spec"]["helm"]["values"],
        serde_json::json!({"a": {"x": 1, "y": 2}, "b": 1, "c": 2})
    );
    let names: Vec<&str> = b[0]["spec"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["chart/Chart.yaml"]);
}

#[test]
fn the_kustomize_binary_missing_is_a_refusal_naming_the_flag() {
    let d = Dir::new("kustomize");
    d.write("fleet.yaml", "{}")
        .write("kustomization.yaml", "resources: []\n");
    let opts = Options {
        kustomize: "/nonexistent/kustomize".into(),
        ..Options::default()
    };
    match convert(std::slice::from_ref(&d.0), &opts) {
        Err(Error::Refused(r)) => {
            assert_eq!(r[0].path, "kustomization.yaml");
            assert!(r[0].reason.contains("--kustomize PATH"), "{}", r[0].reason);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn fleet_s_own_validations_and_tender_s_limits_are_refused_by_path() {
    let d = Dir::new("validate");
    d.write(
        "a/fleet.yaml",
        "name: same\ndependsOn:\n- acceptedStates: [Ready]\n- name: x\n  acceptedStates: [Bogus]\ntargetCustomizations:\n- name: t\n  clusterName: c\n  helm: {chart: other}\n",
    )
    .write("a/cm.yaml", CM)
    .write("a/other/Chart.yaml", "apiVersion: v2\nname: o\nversion: 0.1.0\n");
    assert_eq!(
        refused(&d.0.join("a"), &Options::default()),
        [
            "dependsOn[0]",
            "dependsOn[1].acceptedStates[0]",
            "targetCustomizations[0].helm.chart"
        ]
    );
    d.write("a/fleet.yaml", "name: same\n")
        .write("b/fleet.yaml", "name: same\n")
        .write("b/cm.yaml", CM);
    assert_eq!(refused(&d.0, &Options::default()), ["name"]);
}

#[test]
fn plain_yaml_is_fleet_s_raw_yaml() {
    let d = Dir::new("raw");
    d.write("fleet.yaml", "helm: {values: {n: 1}}\n")
        .write("cm.yaml", CM)
        .write("not-an-object.yaml", "just: data\n")
        .write("templates/t.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: t\ndata: {n: \"{{ .Values.n }}\"}\n")
        .write("templates/_helpers.tpl", "{{/* dropped, as Fleet drops it */}}")
        .write("sub/fleet.yaml", "{}")
        .write("sub/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: sub\n")
        .write("chart/Chart.yaml", "apiVersion: v2\nname: c\nversion: 0.1.0\n")
        .write("chart/templates/x.yaml", "{{ fail }}");
    let b = &bundles(&d.0, &Options::default())[0];
    let resources: Vec<String> = b["spec"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| match r.get("content") {
            Some(_) => format!("file {}", r["name"].as_str().unwrap()),
            None => format!("object {}", r["metadata"]["name"].as_str().unwrap()),
        })
        .collect();
    assert_eq!(
        resources,
        ["object a", "file Chart.yaml", "file templates/t.yaml"],
        "{b:#}"
    );
    assert_eq!(b["spec"]["helm"]["values"]["n"], 1);
}

#[test]
fn overlays_do_not_touch_a_chart_and_per_target_options_tender_lacks_are_refused() {
    let d = Dir::new("chart-overlays");
    d.write(
        "fleet.yaml",
        "helm: {chart: chart}\ntargetCustomizations:\n- name: a\n  clusterName: a\n  yaml: {overlays: [x]}\n- name: b\n  clusterName: b\n",
    )
    .write("chart/Chart.yaml", "apiVersion: v2\nname: c\nversion: 0.1.0\n")
    .write("chart/overlays/x/keep.yaml", "kept: true\n");
    let b = bundles(&d.0, &Options::default());
    assert_eq!(b.len(), 1, "one Bundle: Fleet ignores overlays on a chart");
    let files: Vec<&str> = b[0]["spec"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["chart/Chart.yaml", "chart/overlays/x/keep.yaml"]);

    d.write(
        "fleet.yaml",
        "targetCustomizations:\n- name: a\n  clusterName: a\n  serviceAccount: sa\n  createNamespace: false\n",
    )
    .write("cm.yaml", CM);
    assert_eq!(
        refused(&d.0, &Options::default()),
        [
            "targetCustomizations[0].serviceAccount",
            "targetCustomizations[0].createNamespace"
        ]
    );
}

#[test]
fn the_root_is_a_bundle_only_with_yaml_outside_fleet_yaml_directories() {
    let d = Dir::new("root");
    d.write("app/fleet.yaml", "{}")
        .write("app/cm.yaml", CM)
        .write("README.md", "x")
        .write(".github/ci.yml", "x: 1");
    assert_eq!(tender_fleet::bundle_dirs(&d.0).unwrap(), [d.0.join("app")]);
    d.write("loose/cm.yaml", CM);
    assert_eq!(
        tender_fleet::bundle_dirs(&d.0).unwrap(),
        [d.0.clone(), d.0.join("app")]
    );
    d.write("fleet.yaml", "{}");
    assert_eq!(
        tender_fleet::bundle_dirs(&d.0).unwrap(),
        [d.0.clone(), d.0.join("app")]
    );
}

#[test]
fn a_value_tender_cannot_read_is_refused_at_its_field() {
    let d = Dir::new("types");
    d.write("fleet.yaml", "rolloutStrategy: {partitions: [{name: 3}]}\ndependsOn: [{name: x, acceptedStates: [Ready]}]\n")
        .write("cm.yaml", CM);
    let r = match convert(std::slice::from_ref(&d.0), &Options::default()) {
        Err(Error::Refused(r)) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(r[0].path, "rolloutStrategy", "{}", r[0].reason);
}

/// A fleet.yaml names files of its repository only: a values file that resolves outside the
/// tree (`..`, an absolute path) is refused by path, and nothing of it is read into a Bundle.
/// Inside a Git repository, the repository is the tree.
#[test]
fn values_files_outside_the_tree_are_refused_not_read() {
    let outside = Dir::new("outside");
    outside.write("secret.yaml", "token: hunter2\n");
    let d = Dir::new("escape");
    let chart = "apiVersion: v2\nname: c\nversion: 0.1.0\n";
    d.write(
        "up/fleet.yaml",
        &format!(
            "helm:\n  chart: ./chart\n  valuesFiles:\n    - ../../{}/secret.yaml\n",
            outside.0.file_name().unwrap().to_string_lossy()
        ),
    )
    .write("up/chart/Chart.yaml", chart);
    d.write(
        "abs/fleet.yaml",
        &format!(
            "helm:\n  chart: ./chart\n  valuesFiles:\n    - {}\n",
            outside.0.join("secret.yaml").display()
        ),
    )
    .write("abs/chart/Chart.yaml", chart);
    let refusals = match convert(std::slice::from_ref(&d.0), &Options::default()) {
        Err(Error::Refused(r)) => r,
        other => panic!("not refused: {other:?}"),
    };
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    for r in &refusals {
        assert_eq!(r.path, "helm.valuesFiles[0]");
        assert!(r.reason.contains("outside the directory"), "{}", r.reason);
        assert!(!r.reason.contains("hunter2"));
    }

    // The same kind of reference inside a Git repository's tree is read.
    let repo = Dir::new("repo");
    repo.write(".git/HEAD", "ref: refs/heads/main\n")
        .write("shared/values.yaml", "from: shared\n")
        .write(
            "apps/web/fleet.yaml",
            "helm:\n  chart: ./chart\n  valuesFiles:\n    - ../../shared/values.yaml\n",
        )
        .write("apps/web/chart/Chart.yaml", chart);
    let b = bundles(&repo.0.join("apps"), &Options::default());
    assert_eq!(b[0]["spec"]["helm"]["values"]["from"], "shared");
}
