//! Lexing and parsing a values template: text with `${ }` actions into [`Node`]s. Unknown
//! functions and variables not in scope are refused here, before anything runs.

use serde_json::Value;

use super::{MAX_DEPTH, TemplateError, err, funcs};

/// `text`'s nodes, every function and variable checked.
pub(super) fn parse(text: &str) -> Result<Vec<Node>, TemplateError> {
    let mut p = Parser::new(lex(text)?);
    let nodes = p.nodes(&[])?;
    if p.at < p.pieces.len() {
        return err("unexpected {{end}} or {{else}} outside of if/with/range");
    }
    Ok(nodes)
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// `.a.b` (empty: `.`).
    Field(Vec<String>),
    /// A variable and a field path on it: `$` (the root), `$.a.b`, `$x`, `$x.a`.
    Var(String, Vec<String>),
    /// `:=`
    Declare,
    /// `=`
    Assign,
    /// `,` (between a range's two variables)
    Comma,
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
            ':' if b.get(i + 1) == Some(&b'=') => {
                toks.push(Tok::Declare);
                i += 2;
            }
            '=' => {
                toks.push(Tok::Assign);
                i += 1;
            }
            ',' => {
                toks.push(Tok::Comma);
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
                // A variable's name: `$` then letters, digits and `_`.
                while c == '$' && i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                let name_end = i;
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
                    let name = s[start..name_end].to_string();
                    toks.push(Tok::Var(name, path(&s[name_end..i])?));
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

#[derive(Debug, Clone)]
pub(super) enum Arg {
    Field(Vec<String>),
    /// A variable (`$` is the root) and a field path on it.
    Var(String, Vec<String>),
    Lit(Value),
    Sub(Pipeline),
    Func(String),
}

/// Commands separated by `|`; each command's first word may be a function.
pub(super) type Pipeline = Vec<Vec<Arg>>;

/// A pipeline with the variables it declares (`$x := …`, a range's `$i, $e := …`) or assigns
/// (`$x = …`).
#[derive(Debug)]
pub(super) struct Pipe {
    pub(super) vars: Vec<String>,
    pub(super) assign: bool,
    pub(super) cmds: Pipeline,
}

#[derive(Debug)]
pub(super) enum Node {
    Text(String),
    /// An action: printed unless it declares or assigns a variable.
    Out(Pipe),
    If(Pipe, Vec<Node>, Vec<Node>),
    With(Pipe, Vec<Node>, Vec<Node>),
    Range(Pipe, Vec<Node>, Vec<Node>),
    Break,
    Continue,
}

struct Parser {
    pieces: Vec<Piece>,
    at: usize,
    /// Blocks open: parsing recurses per block, so its depth is bounded as execution's is.
    depth: usize,
    /// Variables in scope (a block's are dropped at its `end`, as Go's parser does).
    vars: Vec<String>,
    /// `range` bodies open (`break` and `continue` belong in one).
    ranges: usize,
}

impl Parser {
    fn new(pieces: Vec<Piece>) -> Self {
        Self {
            pieces,
            at: 0,
            depth: 0,
            vars: vec!["$".into()],
            ranges: 0,
        }
    }

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
                Some(Tok::Ident(w)) if KEYWORDS.contains(&w.as_str()) => w.clone(),
                _ => String::new(),
            };
            if stops.contains(&kw.as_str()) {
                return Ok(out);
            }
            self.at += 1;
            match kw.as_str() {
                "" => out.push(Node::Out(self.pipe(&toks, "command")?)),
                "else" | "end" => return err(format!("unexpected {kw}")),
                "break" | "continue" => {
                    if self.ranges == 0 {
                        return err(format!("${{ {kw} }} outside ${{ range }}"));
                    }
                    if toks.len() > 1 {
                        return err(format!("{kw} takes no arguments"));
                    }
                    out.push(if kw == "break" {
                        Node::Break
                    } else {
                        Node::Continue
                    });
                }
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
        let scope = self.vars.len();
        let node = self.block_body(kw, toks);
        self.vars.truncate(scope);
        self.depth -= 1;
        node
    }

    fn block_body(&mut self, kw: &str, toks: &[Tok]) -> Result<Node, TemplateError> {
        let pipe = self.pipe(toks, kw)?;
        let in_range = usize::from(kw == "range");
        self.ranges += in_range;
        let body = self.nodes(&["else", "end"]);
        self.ranges -= in_range;
        let body = body?;
        let Some(Piece::Action(next)) = self.pieces.get(self.at) else {
            return err(format!("missing ${{ end }} for {kw}"));
        };
        let next = next.clone();
        self.at += 1;
        let mut other = Vec::new();
        if next.first() == Some(&Tok::Ident("else".into())) {
            if matches!(kw, "if" | "with") && next.get(1) == Some(&Tok::Ident(kw.into())) {
                // `else if …` (`else with …`) closes with the outer `end`.
                other.push(self.block(kw, &next[2..])?);
                return Ok(match kw {
                    "if" => Node::If(pipe, body, other),
                    _ => Node::With(pipe, body, other),
                });
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

    /// An action's pipeline after its keyword (`context`): the variables it declares or
    /// assigns first (`$x :=`, `$x =`, in a range also `$i, $e :=`), as Go's parser reads them.
    fn pipe(&mut self, toks: &[Tok], context: &str) -> Result<Pipe, TemplateError> {
        let mut vars = Vec::new();
        let mut assign = false;
        let mut i = 0;
        while let Some(Tok::Var(name, path)) = toks.get(i) {
            match toks.get(i + 1) {
                Some(Tok::Declare | Tok::Assign) if path.is_empty() => {
                    assign = toks[i + 1] == Tok::Assign;
                    vars.push(name.clone());
                    i += 2;
                    break;
                }
                Some(Tok::Comma) if path.is_empty() => {
                    if context != "range" || !vars.is_empty() {
                        return err(format!("too many declarations in {context}"));
                    }
                    vars.push(name.clone());
                    i += 2;
                    if !matches!(toks.get(i), Some(Tok::Var(..))) {
                        return err("range can only initialize variables");
                    }
                }
                _ if !vars.is_empty() => return err("range can only initialize variables"),
                _ => break,
            }
        }
        if vars.iter().any(|v| v == "$") {
            return err("cannot declare or assign $");
        }
        let cmds = pipeline(&toks[i..], &self.vars)?;
        // Declared after its pipeline is read, in scope until the enclosing block's end.
        self.vars.extend(vars.iter().cloned());
        Ok(Pipe { vars, assign, cmds })
    }
}

/// The words that open, divide or close a block or act on a range.
const KEYWORDS: &[&str] = &["if", "with", "range", "else", "end", "break", "continue"];

/// A pipeline's commands; `vars` are the variables in scope.
fn pipeline(toks: &[Tok], vars: &[String]) -> Result<Pipeline, TemplateError> {
    let mut i = 0;
    let p = pipeline_at(toks, &mut i, 0, vars)?;
    if i < toks.len() {
        return err("unexpected ) in an action");
    }
    Ok(p)
}

fn pipeline_at(
    toks: &[Tok],
    i: &mut usize,
    depth: usize,
    vars: &[String],
) -> Result<Pipeline, TemplateError> {
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
                let sub = pipeline_at(toks, i, depth + 1, vars)?;
                if toks.get(*i) != Some(&Tok::Close) {
                    return err("unclosed (");
                }
                *i += 1;
                cmd.push(Arg::Sub(sub));
            }
            Tok::Field(p) => cmd.push(Arg::Field(p.clone())),
            Tok::Var(name, p) => {
                if !vars.contains(name) {
                    return err(format!("undefined variable {name:?}"));
                }
                cmd.push(Arg::Var(name.clone(), p.clone()));
            }
            Tok::Lit(v) => cmd.push(Arg::Lit(v.clone())),
            Tok::Ident(f) => {
                if KEYWORDS.contains(&f.as_str()) {
                    return err(format!("unexpected {f} in an action"));
                }
                if !funcs::exists(f) {
                    return err(format!("function {f:?} not defined"));
                }
                cmd.push(Arg::Func(f.clone()));
            }
            Tok::Declare | Tok::Assign | Tok::Comma => {
                return err("unexpected := , or = in an action");
            }
        }
    }
    if cmd.is_empty() {
        return err("empty command in an action");
    }
    cmds.push(cmd);
    Ok(cmds)
}
