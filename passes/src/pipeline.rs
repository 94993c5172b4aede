//! Pipelines: the pass lists that `kiln opt --pipeline` takes, as text and as values.
//!
//! ```text
//! pipeline = [ item { "," item } ] ;                 (* empty text is the empty pipeline *)
//! item     = "fixpoint" [ options ] "(" pipeline ")"  (* run the group until no pass changes the graph *)
//!          | name [ options ] ;                       (* a registered pass or named pipeline *)
//! options  = "{" [ option { "," option } ] "}" ;
//! option   = key "=" value ;
//! name     = ( letter | digit ) { letter | digit | "-" | "_" } ;
//! key      = letter { letter | digit | "-" | "_" } ;
//! value    = char { char } ;                          (* any characters but , { } ( ) = and whitespace *)
//! ```
//!
//! Whitespace may separate tokens. Parsing checks every name against the registry and builds every pass once, so
//! unknown passes and unknown or malformed options are reported at parse time with a column and a caret. A named
//! pipeline (`O2`) stays a name in the parsed value (so it prints back as written) and is expanded by
//! [`Pipeline::expand`] when the manager runs it; named pipelines take no options. `fixpoint` takes one option,
//! `max-iterations` (default [`DEFAULT_MAX_ITERATIONS`]); exceeding it is an error naming the group.
//!
//! Printing gives the canonical text: no whitespace, options in the order written. For every pipeline `p`,
//! `parse(print(p)) == p`, and for canonical text `t`, `print(parse(t)) == t`.

use std::fmt;

use crate::pass::{OptionError, OptionValue};
use crate::{pass_named, pipeline_named};

/// Iterations a `fixpoint` group may take before the manager reports that it does not converge.
pub const DEFAULT_MAX_ITERATIONS: usize = 16;

/// One element of a pipeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PipelineItem {
    /// A registered pass with its options.
    Pass {
        /// The pass's name.
        name: String,
        /// Options, in the order written.
        options: Vec<OptionValue>,
    },
    /// A named pipeline (`O2`), expanded when run.
    Named(String),
    /// A group run until a whole iteration changes nothing.
    Fixpoint {
        /// Iteration cap; exceeding it is an error.
        max_iterations: usize,
        /// The group.
        body: Pipeline,
    },
}

/// A sequence of passes, groups and named pipelines. See the module docs for the text form.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pipeline {
    /// The items, run in order.
    pub items: Vec<PipelineItem>,
}

/// Pipeline text that does not parse, or names an unknown pass or option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pipeline column {column}: {message}\n  {text}\n  {caret}")]
pub struct PipelineParseError {
    /// 1-based column (in characters).
    pub column: usize,
    /// What is wrong.
    pub message: String,
    /// The pipeline text.
    pub text: String,
    /// A caret under the column.
    pub caret: String,
}

impl Pipeline {
    /// Parses pipeline text (see the module docs).
    pub fn parse(text: &str) -> Result<Pipeline, PipelineParseError> {
        let mut p = Parser { text, chars: text.chars().collect(), pos: 0 };
        let pipeline = p.pipeline(0)?;
        p.skip_ws();
        match p.peek() {
            None => Ok(pipeline),
            Some(')') => Err(p.error(p.pos, "unmatched `)`".into())),
            Some(c) => Err(p.error(p.pos, format!("expected `,` or the end of the pipeline, found `{c}`"))),
        }
    }

    /// The pipeline with every named pipeline replaced by its items, recursively.
    pub fn expand(&self) -> Pipeline {
        let mut items = Vec::new();
        for item in &self.items {
            match item {
                PipelineItem::Named(name) => match pipeline_named(name).map(|n| Pipeline::parse(n.text)) {
                    Some(Ok(p)) => items.extend(p.expand().items),
                    // Parsing checked the name, and a test checks that every registered text parses; a pipeline
                    // built by hand with a bad name is kept for the manager to report.
                    _ => items.push(item.clone()),
                },
                PipelineItem::Fixpoint { max_iterations, body } => {
                    items.push(PipelineItem::Fixpoint { max_iterations: *max_iterations, body: body.expand() })
                }
                PipelineItem::Pass { .. } => items.push(item.clone()),
            }
        }
        Pipeline { items }
    }
}

impl fmt::Display for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, item) in self.items.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{item}")?;
        }
        Ok(())
    }
}

impl fmt::Display for PipelineItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PipelineItem::Pass { name, options } => {
                f.write_str(name)?;
                write_options(f, options.iter().map(|o| (o.key.as_str(), o.value.clone())))
            }
            PipelineItem::Named(name) => f.write_str(name),
            PipelineItem::Fixpoint { max_iterations, body } => {
                f.write_str("fixpoint")?;
                if *max_iterations != DEFAULT_MAX_ITERATIONS {
                    write_options(f, std::iter::once(("max-iterations", max_iterations.to_string())))?;
                }
                write!(f, "({body})")
            }
        }
    }
}

fn write_options<'a>(
    f: &mut fmt::Formatter<'_>,
    options: impl ExactSizeIterator<Item = (&'a str, String)>,
) -> fmt::Result {
    if options.len() == 0 {
        return Ok(());
    }
    let text: Vec<String> = options.map(|(k, v)| format!("{k}={v}")).collect();
    write!(f, "{{{}}}", text.join(","))
}

/// Nesting deeper than this is rejected, so hostile text cannot overflow the stack.
const MAX_DEPTH: usize = 64;

struct Parser<'t> {
    text: &'t str,
    chars: Vec<char>,
    pos: usize,
}

fn is_value_char(c: char) -> bool {
    !c.is_whitespace() && !",{}()=".contains(c)
}

fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || c == '-' || c == '_'
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn error(&self, at: usize, message: String) -> PipelineParseError {
        let column = at.min(self.chars.len()) + 1;
        let pad: String = self.chars.iter().take(column - 1).map(|&c| if c == '\t' { '\t' } else { ' ' }).collect();
        PipelineParseError { column, message, text: self.text.to_string(), caret: format!("{pad}^") }
    }

    fn found(&self) -> String {
        match self.peek() {
            Some(c) => format!("`{c}`"),
            None => "the end of the pipeline".into(),
        }
    }

    /// A word of `is_name_char`s starting here (after whitespace), with its start.
    fn word(&mut self, what: &str) -> Result<(usize, String), PipelineParseError> {
        self.skip_ws();
        let start = self.pos;
        while self.peek().is_some_and(is_name_char) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.error(start, format!("expected {what}, found {}", self.found())));
        }
        Ok((start, self.chars[start..self.pos].iter().collect()))
    }

    /// Items up to (not including) a `)` or the end.
    fn pipeline(&mut self, depth: usize) -> Result<Pipeline, PipelineParseError> {
        let mut items = Vec::new();
        self.skip_ws();
        if matches!(self.peek(), None | Some(')')) {
            return Ok(Pipeline { items });
        }
        loop {
            items.push(self.item(depth)?);
            if !self.eat(',') {
                return Ok(Pipeline { items });
            }
        }
    }

    fn item(&mut self, depth: usize) -> Result<PipelineItem, PipelineParseError> {
        let (start, name) = self.word("a pass or pipeline name")?;
        let options = self.options()?;
        if name == "fixpoint" {
            return self.fixpoint(start, options, depth);
        }
        if let Some(info) = pass_named(&name) {
            info.create(&options).map_err(|e| self.option_error(start, e))?;
            return Ok(PipelineItem::Pass { name, options });
        }
        if pipeline_named(&name).is_some() {
            if let Some(o) = options.first() {
                return Err(
                    self.error(o.column.map_or(start, |c| c - 1), format!("pipeline `{name}` takes no options"))
                );
            }
            return Ok(PipelineItem::Named(name));
        }
        Err(self.error(start, format!("unknown pass or pipeline `{name}`")))
    }

    fn option_error(&self, start: usize, e: OptionError) -> PipelineParseError {
        self.error(e.column.map_or(start, |c| c - 1), e.message)
    }

    fn fixpoint(
        &mut self,
        start: usize,
        options: Vec<OptionValue>,
        depth: usize,
    ) -> Result<PipelineItem, PipelineParseError> {
        let mut opts = crate::PassOptions::new("fixpoint", &options);
        let max_iterations = opts
            .take::<usize>("max-iterations")
            .map_err(|e| self.option_error(start, e))?
            .unwrap_or(DEFAULT_MAX_ITERATIONS);
        opts.finish(&["max-iterations"]).map_err(|e| self.option_error(start, e))?;
        if max_iterations == 0 {
            return Err(self.error(start, "`fixpoint` needs `max-iterations` of at least 1".into()));
        }
        if depth >= MAX_DEPTH {
            return Err(self.error(start, format!("fixpoint groups nest deeper than {MAX_DEPTH}")));
        }
        self.skip_ws();
        let open = self.pos;
        if !self.eat('(') {
            return Err(self.error(self.pos, format!("expected `(` after `fixpoint`, found {}", self.found())));
        }
        let body = self.pipeline(depth + 1)?;
        if !self.eat(')') {
            let msg =
                format!("expected `,` or `)` closing the `fixpoint(` at column {}, found {}", open + 1, self.found());
            return Err(self.error(self.pos, msg));
        }
        Ok(PipelineItem::Fixpoint { max_iterations, body })
    }

    fn options(&mut self) -> Result<Vec<OptionValue>, PipelineParseError> {
        let mut options = Vec::new();
        if !self.eat('{') {
            return Ok(options);
        }
        if self.eat('}') {
            return Ok(options);
        }
        loop {
            let (start, key) = self.word("an option name")?;
            if !self.eat('=') {
                return Err(self.error(self.pos, format!("expected `=` after option `{key}`, found {}", self.found())));
            }
            self.skip_ws();
            let vstart = self.pos;
            while self.peek().is_some_and(is_value_char) {
                self.pos += 1;
            }
            if vstart == self.pos {
                return Err(self.error(vstart, format!("expected a value for option `{key}`, found {}", self.found())));
            }
            let value: String = self.chars[vstart..self.pos].iter().collect();
            options.push(OptionValue { key, value, column: Some(start + 1) });
            if self.eat('}') {
                return Ok(options);
            }
            if !self.eat(',') {
                return Err(self.error(self.pos, format!("expected `,` or `}}` in options, found {}", self.found())));
            }
        }
    }
}
