//! Fleet's values templating: Go `text/template` with `${ }` delimiters, the subset Fleet's
//! users write (decision 0100-fleet-values-templating). Pure: text and a context in, text out.
//!
//! Supported: text and `${ pipeline }` actions (with `${-` / `-}` trimming), comments
//! `${/* */}`, pipelines `a | b c`, field paths on the context (`.ClusterLabels.env`, `.`,
//! `$`, `$.ClusterName`), string (`"…"`, `` `…` ``), number, `true`/`false`/`nil` literals,
//! parenthesised pipelines, `if` / `else if` / `else` / `end`, `with` / `else with`, `range`
//! over lists, maps (in key order) and integers with `else`, `break` and `continue`, variables
//! (`$x := …`, `$x = …`, `$x.a`, a range's `$i, $e := …`, scoped to their block as in Go),
//! and the functions in [`funcs`]. A missing map key is an
//! error (Fleet runs with `missingkey=error`); `get`, `index` on a map, `hasKey` and `default`
//! are the ways to read a key that may be absent.
//!
//! Errors never quote the context's values or the template's string literals: they name the
//! construct (a field path, a function, a keyword).
//!
//! Work is bounded as well as size and depth (decision 0110-templates-bounded-in-work): every
//! render runs within a [`Budget`] of [`MAX_STEPS`] steps and [`MAX_RENDER_TIME`].

mod exec;
mod funcs;
mod parse;

use std::time::{Duration, Instant};

use serde_json::{Map, Value};

/// Blocks (or parentheses) nested in one template, when parsing and when running.
const MAX_DEPTH: usize = 50;

/// Largest text one template may render (a `range` or `repeat` cannot make the hub hold more).
pub(crate) const MAX_OUTPUT: usize = 1 << 20;

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
    let nodes = parse::parse(text)?;
    let mut out = String::new();
    exec::Run::new(ctx, budget).exec(&nodes, ctx, &mut out, 0)?;
    Ok(out)
}

/// Whether `text` holds a `${` action at all.
pub fn has_actions(text: &str) -> bool {
    text.contains("${")
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
