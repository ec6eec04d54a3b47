//! A reading of `deploy/Dockerfile` good enough to check its final stages against the
//! binaries they run: each stage's `COPY` destinations, `ENV` settings and `ENTRYPOINT`.
//! (Only the instructions the file uses; no line continuations, no variables.)

use std::collections::BTreeMap;

/// One `FROM … AS <name>` stage.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stage {
    /// Its name (`AS …`).
    pub name: String,
    /// `COPY [--from=<stage>] <source> <destination>`: (from stage, source, destination).
    pub copies: Vec<(Option<String>, String, String)>,
    /// `ENV KEY=VALUE`.
    pub env: BTreeMap<String, String>,
    /// `RUN` lines.
    pub runs: Vec<String>,
    /// The program of its `ENTRYPOINT ["…"]`.
    pub entrypoint: Option<String>,
}

/// The stages of `text`, in order.
pub fn stages(text: &str) -> Vec<Stage> {
    let mut out: Vec<Stage> = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (instr, rest) = line.split_once(' ').unwrap_or((line, ""));
        match instr {
            "FROM" => out.push(Stage {
                name: rest
                    .rsplit_once(" AS ")
                    .map(|(_, n)| n.trim().to_string())
                    .unwrap_or_default(),
                ..Default::default()
            }),
            _ if out.is_empty() => {}
            "COPY" => {
                let mut words: Vec<&str> = rest.split_whitespace().collect();
                let from = words
                    .first()
                    .and_then(|w| w.strip_prefix("--from="))
                    .map(str::to_string);
                if from.is_some() {
                    words.remove(0);
                }
                if let [src, dest] = words[..] {
                    out.last_mut()
                        .unwrap()
                        .copies
                        .push((from, src.to_string(), dest.to_string()));
                }
            }
            "ENV" => {
                if let Some((k, v)) = rest.split_once('=') {
                    out.last_mut()
                        .unwrap()
                        .env
                        .insert(k.trim().to_string(), v.trim().to_string());
                }
            }
            "RUN" => out.last_mut().unwrap().runs.push(rest.to_string()),
            "ENTRYPOINT" => {
                out.last_mut().unwrap().entrypoint = serde_json::from_str::<Vec<String>>(rest)
                    .ok()
                    .and_then(|v| v.into_iter().next());
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_copies_env_and_entrypoints_are_read() {
        let s = stages(
            "FROM a AS build\nRUN make\n# c\nFROM b AS hub\nCOPY --from=build /o/x /usr/bin/x\nENV X_PATH=/usr/bin/x\nENTRYPOINT [\"/usr/bin/x\"]\n",
        );
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].runs, ["make"]);
        assert_eq!(s[1].name, "hub");
        assert_eq!(
            s[1].copies,
            [(Some("build".into()), "/o/x".into(), "/usr/bin/x".into())]
        );
        assert_eq!(s[1].env["X_PATH"], "/usr/bin/x");
        assert_eq!(s[1].entrypoint.as_deref(), Some("/usr/bin/x"));
    }
}
