use std::io::Write;

use super::*;

fn entry(name: &str, content: &str, encoding: &str) -> FileEntry {
    FileEntry {
        name: name.into(),
        content: content.into(),
        encoding: encoding.into(),
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn file(name: &str, text: &str) -> File {
    File {
        name: name.into(),
        bytes: text.as_bytes().to_vec(),
    }
}

#[test]
fn the_three_encodings_decode_to_the_same_bytes() {
    let text = "apiVersion: v1\nkind: ConfigMap\n";
    let got = decode_all([
        entry("./a.yaml", text, ""),
        entry("b.yaml", &b64(text.as_bytes()), "base64"),
        entry("dir//c.yaml", &b64(&gz(text.as_bytes())), "base64+gz"),
    ])
    .unwrap();
    assert_eq!(
        got.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
        ["a.yaml", "b.yaml", "dir/c.yaml"]
    );
    assert!(got.iter().all(|f| f.bytes == text.as_bytes()));
}

#[test]
fn bad_encodings_name_the_file() {
    let e = decode_all([entry("x.yaml", "not base64!", "base64")]).unwrap_err();
    assert_eq!(e.file, "x.yaml");
    assert!(e.message.contains("not valid base64"), "{e}");
    let e = decode_all([entry("y.yaml", &b64(b"plain"), "base64+gz")]).unwrap_err();
    assert!(e.message.contains("not valid gzip"), "{e}");
    let e = decode_all([entry("z.yaml", "", "zstd")]).unwrap_err();
    assert!(e.message.contains("\"zstd\""), "{e}");
    let e = decode_all([entry("../up.yaml", "", "")]).unwrap_err();
    assert!(e.message.contains("'..'"), "{e}");
}

#[test]
fn a_gzip_bomb_stops_at_the_bound() {
    // 64 MiB of zeros compress to about 64 KiB.
    let bomb = gz(&vec![0u8; 64 * 1024 * 1024]);
    assert!(bomb.len() < 200_000);
    let e = decode_all([entry("bomb.yaml", &b64(&bomb), "base64+gz")]).unwrap_err();
    assert_eq!(e.file, "bomb.yaml");
    assert!(e.message.contains("larger than 1048576 bytes"), "{e}");
    // Exactly the bound is fine.
    let at = gz(&vec![b'a'; MAX_FILE_BYTES as usize]);
    assert!(decode_all([entry("ok", &b64(&at), "base64+gz")]).is_ok());
}

#[test]
fn the_files_together_are_bounded() {
    let big = "a".repeat(MAX_FILE_BYTES as usize);
    let nine: Vec<FileEntry> = (0..9).map(|i| entry(&format!("f{i}"), &big, "")).collect();
    let e = decode_all(nine.clone()).unwrap_err();
    assert_eq!(e.file, "f8");
    assert!(e.message.contains("together"), "{e}");
    assert!(decode_all(nine.into_iter().take(8)).is_ok());
}

#[test]
fn the_chart_directory_is_the_relative_path_and_needs_its_chart_yaml() {
    let files = [
        file("fleet.yaml", "helm: {}"),
        file("chart/Chart.yaml", "name: x\nversion: 1.0.0\n"),
        file("chart/templates/a.yaml", "a"),
        file("chart-other/b.yaml", "b"),
        file("README.md", "r"),
    ];
    let got = chart_files(&files, "chart").unwrap();
    assert_eq!(
        got.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["Chart.yaml", "templates/a.yaml"],
        "chart-other is not under chart"
    );
    let e = chart_files(&files, "").unwrap_err();
    assert_eq!(e.file, "Chart.yaml");
    let e = chart_files(&files, "missing").unwrap_err();
    assert_eq!(e.file, "missing/Chart.yaml");
    assert!(e.message.starts_with("missing:"), "{e}");
    let root = chart_files(&files[1..3], "chart").unwrap();
    assert_eq!(root.len(), 2);
}

#[test]
fn the_archive_is_the_same_for_the_same_files_and_carries_the_version() {
    let files = [
        file("c/templates/a.yaml", "a"),
        file("c/Chart.yaml", "apiVersion: v2\nname: x\nversion: 1.2.3\n"),
    ];
    let one = chart_archive(&files, "c").unwrap();
    let mut reversed = files.clone();
    reversed.reverse();
    assert_eq!(one, chart_archive(&reversed, "c").unwrap(), "deterministic");
    assert_eq!(archive_version(&one).as_deref(), Some("1.2.3"));
    let other = [
        file("c/templates/a.yaml", "b"),
        file("c/Chart.yaml", "apiVersion: v2\nname: x\nversion: 1.2.3\n"),
    ];
    assert_ne!(one, chart_archive(&other, "c").unwrap());
    assert_eq!(archive_version(b"not an archive"), None);
}

#[test]
fn manifest_files_are_read_outside_chart_directories() {
    let files = [
        file("fleet.yaml", "defaultNamespace: x\n"),
        file(
            "app/cm.yaml",
            "---\n# comment only\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Secret\n  metadata:\n    name: s\n",
        ),
        file(
            "svc.json",
            r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}}"#,
        ),
        file("chart/Chart.yaml", "name: c\n"),
        file("chart/values.yaml", "a: 1\n"),
        file("chart/templates/x.yaml", "{{ .Values.a }}"),
        file("README.md", "# not a manifest"),
    ];
    let got: Vec<_> = manifests(&files)
        .unwrap()
        .iter()
        .map(|m| format!("{}/{}", m.kind().unwrap(), m.name().unwrap()))
        .collect();
    assert_eq!(got, ["ConfigMap/a", "Secret/s", "Service/svc"]);
}

#[test]
fn a_document_without_kind_fails_naming_the_file() {
    let e = manifests(&[file(
        "m/x.yml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\nreplicas: 3\n",
    )])
    .unwrap_err();
    assert_eq!(e.file, "m/x.yml");
    assert!(
        e.message.starts_with("document 2: no apiVersion or kind"),
        "{e}"
    );
    let e = manifests(&[file("n.yaml", "apiVersion: v1\nkind: ConfigMap\n")]).unwrap_err();
    assert!(e.message.contains("metadata.name"), "{e}");
    let e = manifests(&[file("l.yaml", "- a\n- b\n")]).unwrap_err();
    assert!(e.message.contains("not a map"), "{e}");
    assert_eq!(e.manifest().name(), Some("l.yaml"));
}
