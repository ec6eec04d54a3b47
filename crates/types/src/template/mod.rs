//! Fleet's values templating: Go `text/template` with `${ }` delimiters, the subset Fleet's
//! users write (decision 0100-fleet-values-templating). Pure: text and a context in, text out.
//!
//! Supported: text and `${ pipeline }` actions (with `${-` / `-}` trimming), comments
//! `${/* */}`, pipelines `a | b c`, field paths on the context (`.ClusterLabels.env`, `.`,
//! `$`, `$.ClusterName`), string (`"…"`, `` `…` ``), number, `true`/`false`/`nil` literals,
//! parenthesised pipelines, `if` / `else if` / `else` / `end`, `with` and `range` (over lists
//! and maps, without variables), and the functions in [`funcs`]. A missing map key is an
//! error (Fleet runs with `missingkey=error`); `get`, `index` on a map, `hasKey` and `default`
//! are the ways to read a key that may be absent.
//!
//! Errors never quote the context's values or the template's string literals: they name the
//! construct (a field path, a function, a keyword).
//!
//! Work is bounded as well as size and depth (decision 0110-templates-bounded-in-work): every
//! render runs within a [`Budget`] of [`MAX_STEPS`] steps and [`MAX_RENDER_TIME`].

mod funcs;

use std::time::{Duration, Instant};

use serde_json::{Map, Value};

/// Why a template did not render.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TemplateError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, TemplateError> {
    Err(TemplateError(msg.into()))
}

/// Steps one render may take: every node executed, range iteration, pipeline command and
/// function call is one, and so is every [`BYTES_PER_STEP`] bytes a value, a function's
/// result or the output holds. Fleet's templates take tens to a few thousand steps (a `range`
/// over a 1 000-entry list with a few calls per entry is about 10 000); a million is a
/// hundredfold margin over that and takes tens of milliseconds, where nested ranges (1 001^5
/// iterations) would otherwise hold a hub thread for hours.
pub const MAX_STEPS: u64 = 1_000_000;

/// Wall-clock time one render may take, the backstop for steps that cost more than the step
/// count says (a clone of a large value): [`MAX_STEPS`] take well under it, and a hub planning
/// a Bundle for 100 clusters spends at most 10 s on its templates.
pub const MAX_RENDER_TIME: Duration = Duration::from_millis(100);

/// Bytes one step pays for (a copy of 64 bytes costs about what a step does).
pub const BYTES_PER_STEP: usize = 64;

/// Steps between two looks at the clock (reading it costs about 25 ns; 256 steps a few µs).
const STEPS_PER_CLOCK: u64 = 256;

/// The work a render may still do. One budget may be shared by several renders (one cluster's
/// values, `customize::preprocess`), so the number of templated strings does not multiply it.
#[derive(Debug, Clone)]
pub struct Budget {
    steps: u64,
    max_steps: u64,
    started: Instant,
    max_time: Duration,
    next_clock: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Self::new(MAX_STEPS, MAX_RENDER_TIME)
    }
}

impl Budget {
    /// `max_steps` steps and `max_time` from now.
    pub fn new(max_steps: u64, max_time: Duration) -> Self {
        Self {
            steps: 0,
            max_steps,
            started: Instant::now(),
            max_time,
            next_clock: STEPS_PER_CLOCK,
        }
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Takes `n` steps; over the budget (steps, or time at every [`STEPS_PER_CLOCK`]) is an
    /// error naming the budget, never what was being rendered.
    pub(crate) fn charge(&mut self, n: u64) -> Result<(), TemplateError> {
        self.steps = self.steps.saturating_add(n);
        if self.steps > self.max_steps {
            return err(format!(
                "template exceeded its budget of {} steps",
                self.max_steps
            ));
        }
        if self.steps >= self.next_clock {
            self.next_clock = self.steps + STEPS_PER_CLOCK;
            if self.started.elapsed() > self.max_time {
                return err(format!(
                    "template exceeded its budget of {} ms",
                    self.max_time.as_millis()
                ));
            }
        }
        Ok(())
    }

    /// Pays for `bytes` bytes about to be made or copied.
    pub(crate) fn charge_bytes(&mut self, bytes: usize) -> Result<(), TemplateError> {
        self.charge((bytes / BYTES_PER_STEP) as u64)
    }

    /// Pays for a copy of `v`: its text, or one step per entry of a list or map (the entries'
    /// own contents were paid for when they were made, or are the context's).
    pub(crate) fn charge_value(&mut self, v: &Value) -> Result<(), TemplateError> {
        match v {
            Value::String(s) => self.charge_bytes(s.len()),
            Value::Array(a) => self.charge(a.len() as u64),
            Value::Object(m) => self.charge(m.len() as u64),
            _ => Ok(()),
        }
    }
}

/// Renders `text` with `${ }` delimiters against `ctx`, within a budget of its own.
pub fn render(text: &str, ctx: &Value) -> Result<String, TemplateError> {
    render_within(text, ctx, &mut Budget::default())
}

/// Renders `text` against `ctx`, taking its steps from `budget`.
pub fn render_within(
    text: &str,
    ctx: &Value,
    budget: &mut Budget,
) -> Result<String, TemplateError> {
    // Lexing and parsing are linear in the text (and the text is bounded by the object's size).
    budget.charge_bytes(text.len())?;
    let pieces = lex(text)?;
    let mut p = Parser {
        pieces,
        at: 0,
        depth: 0,
    };
    let nodes = p.nodes(&[])?;
    if p.at < p.pieces.len() {
        return err("unexpected {{end}} or {{else}} outside of if/with/range");
    }
    let mut out = String::new();
    let mut run = Run { root: ctx, budget };
    run.exec(&nodes, ctx, &mut out, 0)?;
    Ok(out)
}

/// Whether `text` holds a `${` action at all.
pub fn has_actions(text: &str) -> bool {
    text.contains("${")
}

// ---- lexing ----

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// `.a.b` (empty: `.`).
    Field(Vec<String>),
    /// `$` or `$.a.b`.
    Root(Vec<String>),
    Ident(String),
    Lit(Value),
    Pipe,
    Open,
    Close,
}

#[derive(Debug)]
enum Piece {
    Text(String),
    Action(Vec<Tok>),
}

fn lex(text: &str) -> Result<Vec<Piece>, TemplateError> {
    let mut pieces = Vec::new();
    let mut rest = text;
    let mut trim_next = false;
    while let Some(start) = rest.find("${") {
        let mut before = &rest[..start];
        if trim_next {
            before = before.trim_start();
        }
        let mut inner = &rest[start + 2..];
        let trim_before =
            inner.starts_with("- ") || inner.starts_with("-\t") || inner.starts_with("-\n");
        if trim_before {
            before = before.trim_end();
            inner = &inner[1..];
        }
        if !before.is_empty() {
            pieces.push(Piece::Text(before.to_string()));
        }
        let (toks, consumed, trim_after) = lex_action(inner)?;
        if !toks.is_empty() {
            pieces.push(Piece::Action(toks));
        }
        trim_next = trim_after;
        rest = &inner[consumed..];
    }
    let last = if trim_next { rest.trim_start() } else { rest };
    if !last.is_empty() {
        pieces.push(Piece::Text(last.to_string()));
    }
    Ok(pieces)
}

/// Tokens of one action up to its closing `}`; bytes consumed (with the `}`); whether it ends
/// with ` -}`.
fn lex_action(s: &str) -> Result<(Vec<Tok>, usize, bool), TemplateError> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut toks = Vec::new();
    let trimmed = s.trim_start();
    if trimmed.starts_with("/*") {
        let off = s.len() - trimmed.len();
        let Some(end) = trimmed.find("*/") else {
            return err("unclosed comment");
        };
        let after = &s[off + end + 2..];
        let t = after.trim_start();
        let (trim, t2) = match t.strip_prefix('-') {
            Some(r) if r.starts_with('}') => (true, r),
            _ => (false, t),
        };
        if !t2.starts_with('}') {
            return err("comment ends without a closing }");
        }
        return Ok((toks, s.len() - t2.len() + 1, trim));
    }
    while i < b.len() {
        let c = b[i] as char;
        match c {
            ' ' | '\t' | '\n' | '\r' => i += 1,
            '-' if s[i + 1..].starts_with('}') && i > 0 && b[i - 1].is_ascii_whitespace() => {
                return Ok((toks, i + 2, true));
            }
            '}' => return Ok((toks, i + 1, false)),
            '|' => {
                toks.push(Tok::Pipe);
                i += 1;
            }
            '(' => {
                toks.push(Tok::Open);
                i += 1;
            }
            ')' => {
                toks.push(Tok::Close);
                i += 1;
            }
            '"' => {
                let (v, n) = quoted(&s[i..])?;
                toks.push(Tok::Lit(Value::String(v)));
                i += n;
            }
            '`' => {
                let Some(end) = s[i + 1..].find('`') else {
                    return err("unterminated raw string");
                };
                toks.push(Tok::Lit(Value::String(s[i + 1..i + 1 + end].to_string())));
                i += end + 2;
            }
            '.' | '$' => {
                let start = i;
                i += 1;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.')
                {
                    i += 1;
                }
                let word = &s[start..i];
                let path = |w: &str| -> Result<Vec<String>, TemplateError> {
                    if w.is_empty() {
                        return Ok(Vec::new());
                    }
                    let Some(w) = w.strip_prefix('.') else {
                        return err("bad field path");
                    };
                    let parts: Vec<String> = w.split('.').map(str::to_string).collect();
                    if parts.iter().any(String::is_empty) {
                        return err("bad field path");
                    }
                    Ok(parts)
                };
                if c == '$' {
                    toks.push(Tok::Root(path(&word[1..])?));
                } else if word == "." {
                    toks.push(Tok::Field(Vec::new()));
                } else {
                    toks.push(Tok::Field(path(word)?));
                }
            }
            c if c.is_ascii_digit()
                || (c == '-' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) =>
            {
                let start = i;
                i += 1;
                while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
                    i += 1;
                }
                let n: Value = serde_json::from_str(&s[start..i])
                    .map_err(|_| TemplateError("bad number".into()))?;
                toks.push(Tok::Lit(n));
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                toks.push(match &s[start..i] {
                    "true" => Tok::Lit(Value::Bool(true)),
                    "false" => Tok::Lit(Value::Bool(false)),
                    "nil" => Tok::Lit(Value::Null),
                    w => Tok::Ident(w.to_string()),
                });
            }
            _ => return err(format!("unexpected character {c:?} in an action")),
        }
    }
    err("unclosed action: a ${ without its }")
}

/// A Go double-quoted string at the start of `s`: its value and length.
fn quoted(s: &str) -> Result<(String, usize), TemplateError> {
    let mut out = String::new();
    let mut chars = s.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((out, i + 1)),
            '\\' => match chars.next().map(|(_, c)| c) {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('\\') => out.push('\\'),
                Some('"') => out.push('"'),
                _ => return err("unsupported escape in a string"),
            },
            '\n' => break,
            c => out.push(c),
        }
    }
    err("unterminated string")
}

// ---- parsing ----

#[derive(Debug, Clone)]
enum Arg {
    Field(Vec<String>),
    Root(Vec<String>),
    Lit(Value),
    Sub(Pipeline),
    Func(String),
}

/// Commands separated by `|`; each command's first word may be a function.
type Pipeline = Vec<Vec<Arg>>;

#[derive(Debug)]
enum Node {
    Text(String),
    Out(Pipeline),
    If(Pipeline, Vec<Node>, Vec<Node>),
    With(Pipeline, Vec<Node>, Vec<Node>),
    Range(Pipeline, Vec<Node>, Vec<Node>),
}

struct Parser {
    pieces: Vec<Piece>,
    at: usize,
    /// Blocks open: parsing recurses per block, so its depth is bounded as execution's is.
    depth: usize,
}

impl Parser {
    /// Nodes up to (not including) an action starting with one of `stops`.
    fn nodes(&mut self, stops: &[&str]) -> Result<Vec<Node>, TemplateError> {
        let mut out = Vec::new();
        while self.at < self.pieces.len() {
            let toks = match &self.pieces[self.at] {
                Piece::Text(t) => {
                    out.push(Node::Text(t.clone()));
                    self.at += 1;
                    continue;
                }
                Piece::Action(t) => t.clone(),
            };
            let kw = match toks.first() {
                Some(Tok::Ident(w))
                    if matches!(w.as_str(), "if" | "with" | "range" | "else" | "end") =>
                {
                    w.clone()
                }
                _ => String::new(),
            };
            if stops.contains(&kw.as_str()) {
                return Ok(out);
            }
            self.at += 1;
            match kw.as_str() {
                "" => out.push(Node::Out(pipeline(&toks)?)),
                "else" | "end" => return err(format!("unexpected {kw}")),
                _ => out.push(self.block(&kw, &toks[1..])?),
            }
        }
        if stops.is_empty() {
            Ok(out)
        } else {
            err("missing ${ end }")
        }
    }

    /// An `if`/`with`/`range` block whose opening action's tokens after the keyword are `toks`.
    fn block(&mut self, kw: &str, toks: &[Tok]) -> Result<Node, TemplateError> {
        if self.depth >= MAX_DEPTH {
            return err("template nested too deeply");
        }
        self.depth += 1;
        let node = self.block_body(kw, toks);
        self.depth -= 1;
        node
    }

    fn block_body(&mut self, kw: &str, toks: &[Tok]) -> Result<Node, TemplateError> {
        let pipe = pipeline(toks)?;
        let body = self.nodes(&["else", "end"])?;
        let Some(Piece::Action(next)) = self.pieces.get(self.at) else {
            return err(format!("missing ${{ end }} for {kw}"));
        };
        let next = next.clone();
        self.at += 1;
        let mut other = Vec::new();
        if next.first() == Some(&Tok::Ident("else".into())) {
            if next.get(1) == Some(&Tok::Ident("if".into())) && kw == "if" {
                // `else if …` closes with the outer `end`.
                other.push(self.block("if", &next[2..])?);
                return Ok(Node::If(pipe, body, other));
            }
            if next.len() > 1 {
                return err("else takes no arguments here");
            }
            other = self.nodes(&["else", "end"])?;
            match self.pieces.get(self.at) {
                Some(Piece::Action(t)) if t.first() == Some(&Tok::Ident("end".into())) => {
                    self.at += 1
                }
                _ => return err(format!("missing ${{ end }} for {kw}")),
            }
        }
        Ok(match kw {
            "if" => Node::If(pipe, body, other),
            "with" => Node::With(pipe, body, other),
            _ => Node::Range(pipe, body, other),
        })
    }
}

fn pipeline(toks: &[Tok]) -> Result<Pipeline, TemplateError> {
    let mut i = 0;
    let p = pipeline_at(toks, &mut i, 0)?;
    if i < toks.len() {
        return err("unexpected ) in an action");
    }
    Ok(p)
}

fn pipeline_at(toks: &[Tok], i: &mut usize, depth: usize) -> Result<Pipeline, TemplateError> {
    if depth > MAX_DEPTH {
        return err("template nested too deeply");
    }
    let mut cmds = Vec::new();
    let mut cmd = Vec::new();
    while *i < toks.len() {
        let t = &toks[*i];
        *i += 1;
        match t {
            Tok::Pipe => {
                if cmd.is_empty() {
                    return err("missing command before |");
                }
                cmds.push(std::mem::take(&mut cmd));
            }
            Tok::Close => {
                *i -= 1;
                break;
            }
            Tok::Open => {
                let sub = pipeline_at(toks, i, depth + 1)?;
                if toks.get(*i) != Some(&Tok::Close) {
                    return err("unclosed (");
                }
                *i += 1;
                cmd.push(Arg::Sub(sub));
            }
            Tok::Field(p) => cmd.push(Arg::Field(p.clone())),
            Tok::Root(p) => cmd.push(Arg::Root(p.clone())),
            Tok::Lit(v) => cmd.push(Arg::Lit(v.clone())),
            Tok::Ident(f) => {
                if !funcs::exists(f) {
                    return err(format!("function {f:?} not defined"));
                }
                cmd.push(Arg::Func(f.clone()));
            }
        }
    }
    if cmd.is_empty() {
        return err("empty command in an action");
    }
    cmds.push(cmd);
    Ok(cmds)
}

// ---- execution ----

const MAX_DEPTH: usize = 50;

/// Largest text one template may render (a `range` or `repeat` cannot make the hub hold more).
pub(crate) const MAX_OUTPUT: usize = 1 << 20;

/// One execution: the context's root and the budget every step is taken from.
struct Run<'a, 'b> {
    root: &'a Value,
    budget: &'b mut Budget,
}

impl Run<'_, '_> {
    fn exec(
        &mut self,
        nodes: &[Node],
        dot: &Value,
        out: &mut String,
        depth: usize,
    ) -> Result<(), TemplateError> {
        if depth > MAX_DEPTH {
            return err("template nested too deeply");
        }
        for n in nodes {
            self.budget.charge(1)?;
            if out.len() > MAX_OUTPUT {
                return err("the rendered text is larger than 1 MiB");
            }
            match n {
                Node::Text(t) => {
                    self.budget.charge_bytes(t.len())?;
                    out.push_str(t);
                }
                Node::Out(p) => {
                    let text = funcs::print(&self.eval(p, dot)?);
                    self.budget.charge_bytes(text.len())?;
                    out.push_str(&text);
                }
                Node::If(p, then, other) => {
                    let branch = if funcs::truth(&self.eval(p, dot)?) {
                        then
                    } else {
                        other
                    };
                    self.exec(branch, dot, out, depth + 1)?;
                }
                Node::With(p, then, other) => {
                    let v = self.eval(p, dot)?;
                    if funcs::truth(&v) {
                        self.exec(then, &v, out, depth + 1)?;
                    } else {
                        self.exec(other, dot, out, depth + 1)?;
                    }
                }
                Node::Range(p, body, other) => {
                    let v = self.eval(p, dot)?;
                    let items: Vec<&Value> = match &v {
                        Value::Array(a) => a.iter().collect(),
                        // Go ranges over a map in key order.
                        Value::Object(m) => {
                            let mut keys: Vec<&String> = m.keys().collect();
                            keys.sort();
                            keys.into_iter().map(|k| &m[k]).collect()
                        }
                        Value::Null => Vec::new(),
                        _ => return err("range over something that is neither a list nor a map"),
                    };
                    if items.is_empty() {
                        self.exec(other, dot, out, depth + 1)?;
                    }
                    for item in items {
                        // Each iteration is a step even when its body is empty.
                        self.budget.charge(1)?;
                        self.exec(body, item, out, depth + 1)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn eval(&mut self, p: &Pipeline, dot: &Value) -> Result<Value, TemplateError> {
        let mut last: Option<Value> = None;
        for cmd in p {
            self.budget.charge(1)?;
            let (head, rest) = cmd.split_first().expect("commands are never empty");
            let mut args = Vec::with_capacity(rest.len() + 1);
            for a in rest {
                args.push(self.operand(a, dot)?);
            }
            last = Some(match head {
                Arg::Func(f) => {
                    if let Some(prev) = last.take() {
                        args.push(prev);
                    }
                    self.call(f, args)?
                }
                a => {
                    if !args.is_empty() || last.is_some() {
                        return err("only a function takes arguments");
                    }
                    self.operand(a, dot)?
                }
            });
        }
        Ok(last.unwrap_or(Value::Null))
    }

    fn operand(&mut self, a: &Arg, dot: &Value) -> Result<Value, TemplateError> {
        let v = match a {
            Arg::Field(path) => walk(dot, path)?,
            Arg::Root(path) => walk(self.root, path)?,
            Arg::Lit(v) => v.clone(),
            Arg::Sub(p) => return self.eval(p, dot),
            Arg::Func(f) => return self.call(f, Vec::new()),
        };
        // A copy of the context's value or a literal.
        self.budget.charge_value(&v)?;
        Ok(v)
    }

    /// A function call: a step, what it makes bounded before it is made (in
    /// [`funcs::call`]), and its result paid for.
    fn call(&mut self, f: &str, args: Vec<Value>) -> Result<Value, TemplateError> {
        self.budget.charge(1)?;
        let v = funcs::call(f, args, self.budget)?;
        self.budget.charge_value(&v)?;
        Ok(v)
    }
}

/// Follows `path` from `v`; a missing key is an error naming the path (Fleet's
/// `missingkey=error`).
fn walk(v: &Value, path: &[String]) -> Result<Value, TemplateError> {
    let mut cur = v;
    for (i, key) in path.iter().enumerate() {
        let shown = || format!(".{}", path[..=i].join("."));
        cur = match cur {
            Value::Object(m) => match m.get(key) {
                Some(v) => v,
                None => return err(format!("map has no entry for key {key:?} at {}", shown())),
            },
            Value::Null => return err(format!("nil pointer evaluating {}", shown())),
            _ => {
                return err(format!(
                    "can't evaluate field {key} at {}: not a map",
                    shown()
                ));
            }
        };
    }
    Ok(cur.clone())
}

/// The template context of one cluster, with Fleet's keys.
pub fn context(
    name: &str,
    namespace: &str,
    labels: &std::collections::BTreeMap<String, String>,
    annotations: &std::collections::BTreeMap<String, String>,
    values: Option<&Map<String, Value>>,
) -> Value {
    let strings = |m: &std::collections::BTreeMap<String, String>| {
        Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect(),
        )
    };
    serde_json::json!({
        "ClusterName": name,
        "ClusterNamespace": namespace,
        "ClusterLabels": strings(labels),
        "ClusterAnnotations": strings(annotations),
        "ClusterValues": values.cloned().map(Value::Object).unwrap_or_else(|| Value::Object(Map::new())),
    })
}

#[cfg(test)]
mod tests;
