//! Running a parsed values template against a context, every step taken from its budget.

use serde_json::Value;

use super::parse::{Arg, Node, Pipe, Pipeline};
use super::{Budget, MAX_DEPTH, MAX_OUTPUT, TemplateError, err, funcs};

/// How a list of nodes ended: at its end, or at a `break` or `continue` of the range it is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flow {
    Normal,
    Break,
    Continue,
}

/// What a `range` iterates: a list, a map's entries in key order (as Go), or `0..n`.
enum Items<'v> {
    List(&'v [Value]),
    Map(Vec<(&'v String, &'v Value)>),
    Count(i64),
}

impl<'v> Items<'v> {
    fn of(v: &'v Value) -> Result<Self, TemplateError> {
        Ok(match v {
            Value::Array(a) => Items::List(a),
            Value::Object(m) => {
                let mut entries: Vec<(&String, &Value)> = m.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                Items::Map(entries)
            }
            Value::Null => Items::List(&[]),
            Value::Number(n) if n.as_i64().is_some() => Items::Count(n.as_i64().unwrap_or(0)),
            _ => return err("range over something that is neither a list, a map nor an integer"),
        })
    }

    fn len(&self) -> usize {
        match self {
            Items::List(a) => a.len(),
            Items::Map(m) => m.len(),
            Items::Count(n) => usize::try_from(*n).unwrap_or(0),
        }
    }

    /// The `n`th index (or key) and element.
    fn get(&self, n: usize) -> (Value, std::borrow::Cow<'v, Value>) {
        use std::borrow::Cow;
        match self {
            Items::List(a) => (Value::from(n), Cow::Borrowed(&a[n])),
            Items::Map(m) => (Value::String(m[n].0.clone()), Cow::Borrowed(m[n].1)),
            Items::Count(_) => (Value::from(n), Cow::Owned(Value::from(n))),
        }
    }
}

/// One execution: the context's root, the variables in scope and the budget every step is
/// taken from.
pub(super) struct Run<'a, 'b> {
    root: &'a Value,
    /// Innermost last; a block's are dropped at its end.
    vars: Vec<(String, Value)>,
    budget: &'b mut Budget,
}

impl<'a, 'b> Run<'a, 'b> {
    pub(super) fn new(root: &'a Value, budget: &'b mut Budget) -> Self {
        Self {
            root,
            vars: Vec::new(),
            budget,
        }
    }

    pub(super) fn exec(
        &mut self,
        nodes: &[Node],
        dot: &Value,
        out: &mut String,
        depth: usize,
    ) -> Result<Flow, TemplateError> {
        if depth > MAX_DEPTH {
            return err("template nested too deeply");
        }
        for n in nodes {
            self.budget.charge(1)?;
            if out.len() > MAX_OUTPUT {
                return err("the rendered text is larger than 1 MiB");
            }
            let flow = match n {
                Node::Text(t) => {
                    self.budget.charge_bytes(t.len())?;
                    out.push_str(t);
                    Flow::Normal
                }
                Node::Out(p) => {
                    let v = self.eval_pipe(p, dot)?;
                    if p.vars.is_empty() {
                        let text = funcs::print(&v);
                        self.budget.charge_bytes(text.len())?;
                        out.push_str(&text);
                    }
                    Flow::Normal
                }
                Node::If(p, then, other) => {
                    let scope = self.vars.len();
                    let branch = if funcs::truth(&self.eval_pipe(p, dot)?) {
                        then
                    } else {
                        other
                    };
                    let flow = self.exec(branch, dot, out, depth + 1);
                    self.vars.truncate(scope);
                    flow?
                }
                Node::With(p, then, other) => {
                    let scope = self.vars.len();
                    let v = self.eval_pipe(p, dot)?;
                    let flow = if funcs::truth(&v) {
                        self.exec(then, &v, out, depth + 1)
                    } else {
                        self.exec(other, dot, out, depth + 1)
                    };
                    self.vars.truncate(scope);
                    flow?
                }
                Node::Range(p, body, other) => {
                    let scope = self.vars.len();
                    let flow = self.range(p, body, other, dot, out, depth);
                    self.vars.truncate(scope);
                    flow?
                }
                Node::Break => Flow::Break,
                Node::Continue => Flow::Continue,
            };
            if flow != Flow::Normal {
                return Ok(flow);
            }
        }
        Ok(Flow::Normal)
    }

    /// A `range`: its body once per element (dot the element, its variables set as Go sets
    /// them: one is the element, two are the index or key and the element), or its `else`
    /// when there is none. A `break` or `continue` ends here.
    fn range(
        &mut self,
        p: &Pipe,
        body: &[Node],
        other: &[Node],
        dot: &Value,
        out: &mut String,
        depth: usize,
    ) -> Result<Flow, TemplateError> {
        let v = self.eval(&p.cmds, dot)?;
        let items = Items::of(&v)?;
        if matches!(items, Items::Count(_)) && p.vars.len() > 1 {
            return err("can't use an integer to iterate over more than one variable");
        }
        if items.len() == 0 {
            self.bind(p, v.clone())?;
            return self.exec(other, dot, out, depth + 1);
        }
        // Declared once (their values set per iteration), as Go does.
        let first = self.vars.len();
        if !p.assign {
            for name in &p.vars {
                self.vars.push((name.clone(), Value::Null));
            }
        }
        let scope = self.vars.len();
        for n in 0..items.len() {
            // Each iteration is a step even when its body is empty.
            self.budget.charge(1)?;
            let (key, elem) = items.get(n);
            let values = match p.vars.len() {
                0 => vec![],
                1 => vec![elem.as_ref().clone()],
                _ => vec![key, elem.as_ref().clone()],
            };
            for (i, value) in values.into_iter().enumerate() {
                self.budget.charge_value(&value)?;
                if p.assign {
                    self.set(&p.vars[i], value)?;
                } else {
                    self.vars[first + i].1 = value;
                }
            }
            let flow = self.exec(body, &elem, out, depth + 1);
            self.vars.truncate(scope);
            if flow? == Flow::Break {
                break;
            }
        }
        Ok(Flow::Normal)
    }

    /// A pipeline's value, bound to the variables it declares or assigns.
    fn eval_pipe(&mut self, p: &Pipe, dot: &Value) -> Result<Value, TemplateError> {
        let v = self.eval(&p.cmds, dot)?;
        self.bind(p, v.clone())?;
        Ok(v)
    }

    fn bind(&mut self, p: &Pipe, v: Value) -> Result<(), TemplateError> {
        for name in &p.vars {
            self.budget.charge_value(&v)?;
            if p.assign {
                self.set(name, v.clone())?;
            } else {
                self.vars.push((name.clone(), v.clone()));
            }
        }
        Ok(())
    }

    /// Assigns the innermost variable called `name` (`$x = …`).
    fn set(&mut self, name: &str, v: Value) -> Result<(), TemplateError> {
        let Some(i) = self.lookup(name)? else {
            return err(format!("undefined variable {name:?}"));
        };
        self.vars[i].1 = v;
        Ok(())
    }

    /// Where the innermost variable called `name` is; a step per 16 variables passed.
    fn lookup(&mut self, name: &str) -> Result<Option<usize>, TemplateError> {
        let found = self.vars.iter().rposition(|(n, _)| n == name);
        let passed = self.vars.len() - found.map_or(0, |i| i + 1);
        self.budget.charge(passed as u64 / 16)?;
        Ok(found)
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
            Arg::Var(name, path) if name == "$" => walk(self.root, path)?,
            Arg::Var(name, path) => {
                let Some(i) = self.lookup(name)? else {
                    return err(format!("undefined variable {name:?}"));
                };
                walk(&self.vars[i].1, path)?
            }
            Arg::Lit(v) => v.clone(),
            Arg::Sub(p) => return self.eval(p, dot),
            Arg::Func(f) => return self.call(f, Vec::new()),
        };
        // A copy of the context's value, a variable's or a literal.
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
