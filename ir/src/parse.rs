//! The `.kir` parser: text to a typed [`Graph`], or one positioned [`ParseError`].
//!
//! A hand-written recursive-descent parser over the tokens of [`lexer`]. It is driven by the op table: a mnemonic
//! is looked up with [`Op::mnemonics`], and the op and its attribute block are read by [`Op::parse`] through this
//! parser's [`AttrSource`] implementation, so no op has parsing code of its own here. Values are SSA: each is
//! defined once, before any use. Every node is type-checked as it is read: operand count against [`Op::arity`],
//! declared result types against [`infer`] (source ops `input` and `param` take their declared type). The first
//! error stops parsing; it carries line, column and the source line with a caret. No input makes the parser
//! panic. The grammar is in `docs/kir.md`.

mod lexer;

use std::collections::{BTreeSet, HashMap};

use crate::attr::AttrSource;
use crate::graph::{Graph, Node, Value};
use crate::infer::infer;
use crate::op::Op;
use crate::types::{DType, Dim, Shape, TensorType};
use lexer::{Kind, Token, lex};

/// A `.kir` syntax or semantic error at a position, with the offending line and a caret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: {message}\n{snippet}")]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column (in characters).
    pub col: usize,
    /// What is wrong.
    pub message: String,
    /// The source line and a caret under the column.
    pub snippet: String,
}

impl ParseError {
    /// An error at byte `offset` of `src` (clamped into the text and onto a char boundary).
    fn at(src: &str, offset: usize, message: String) -> ParseError {
        let mut offset = offset.min(src.len());
        while !src.is_char_boundary(offset) {
            offset -= 1;
        }
        let line_start = src[..offset].rfind('\n').map_or(0, |i| i + 1);
        let line_end = src[offset..].find('\n').map_or(src.len(), |i| offset + i);
        let line_text = src[line_start..line_end].trim_end_matches('\r');
        let before = &src[line_start..offset];
        // Tabs stay tabs so the caret lines up however the terminal renders them.
        let pad: String = before.chars().map(|c| if c == '\t' { '\t' } else { ' ' }).collect();
        ParseError {
            line: src[..line_start].matches('\n').count() + 1,
            col: before.chars().count() + 1,
            message,
            snippet: format!("{line_text}\n{pad}^"),
        }
    }
}

/// Parses `.kir` text into a graph.
pub fn parse(src: &str) -> Result<Graph, ParseError> {
    let mut p = Parser {
        src,
        toks: lex(src),
        pos: 0,
        last_fail: None,
        graph: Graph::new(""),
        values: HashMap::new(),
        input_names: BTreeSet::new(),
        output_names: BTreeSet::new(),
        depth: 0,
    };
    p.graph_def()?;
    Ok(p.graph)
}

/// A failure inside the parser: the token it points at and the message.
type Fail = (usize, String);

struct Parser<'a> {
    src: &'a str,
    toks: Vec<Token>,
    /// Index of the current token; never past the final `Eof`.
    pos: usize,
    /// The token an [`AttrSource`] read last failed on, cleared by every successful read.
    last_fail: Option<usize>,
    graph: Graph,
    /// Defined values by name (the text after `%`).
    values: HashMap<String, Value>,
    input_names: BTreeSet<String>,
    output_names: BTreeSet<String>,
    /// How many `fusion` bodies enclose the graph being read.
    depth: usize,
}

/// How deeply region bodies may nest; deeper text is an error rather than a stack overflow.
const MAX_DEPTH: usize = crate::fusion::MAX_NESTING;

impl Parser<'_> {
    fn peek(&self) -> &Token {
        &self.toks[self.pos]
    }

    fn peek_at(&self, ahead: usize) -> &Token {
        &self.toks[(self.pos + ahead).min(self.toks.len() - 1)]
    }

    fn bump(&mut self) -> usize {
        let i = self.pos;
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        self.last_fail = None;
        i
    }

    fn text(&self, i: usize) -> &str {
        let t = &self.toks[i];
        &self.src[t.start..t.end]
    }

    fn is_punct(&self, c: char) -> bool {
        self.peek().kind == Kind::Punct(c)
    }

    fn is_ident(&self, word: &str) -> bool {
        self.peek().kind == Kind::Ident && self.text(self.pos) == word
    }

    /// How a token reads in a message.
    fn describe(&self, i: usize) -> String {
        match &self.toks[i].kind {
            Kind::Eof => "end of input".into(),
            Kind::Str(_) => format!("string {}", self.text(i)),
            _ => format!("`{}`", self.text(i)),
        }
    }

    /// A positioned error; at a lexical-error token the lexer's message wins, as it is the real cause.
    fn error(&self, (i, message): Fail) -> ParseError {
        let t = &self.toks[i.min(self.toks.len() - 1)];
        let message = match &t.kind {
            Kind::Error(m) => m.clone(),
            _ => message,
        };
        ParseError::at(self.src, t.start, message)
    }

    fn unexpected(&self, what: &str) -> Fail {
        (self.pos, format!("expected {what}, found {}", self.describe(self.pos)))
    }

    fn expect_punct(&mut self, c: char) -> Result<usize, Fail> {
        if self.is_punct(c) { Ok(self.bump()) } else { Err(self.unexpected(&format!("`{c}`"))) }
    }

    fn expect_string(&mut self, what: &str) -> Result<(usize, String), Fail> {
        match &self.peek().kind {
            Kind::Str(s) => {
                let s = s.clone();
                Ok((self.bump(), s))
            }
            _ => Err(self.unexpected(what)),
        }
    }

    fn graph_def(&mut self) -> Result<(), ParseError> {
        self.graph_body().map_err(|f| self.error(f))
    }

    fn graph_body(&mut self) -> Result<(), Fail> {
        self.graph_block()?;
        if self.peek().kind != Kind::Eof {
            return Err((self.pos, format!("unexpected {} after the end of the graph", self.describe(self.pos))));
        }
        Ok(())
    }

    /// `graph "name" { statements }`, into `self.graph`.
    fn graph_block(&mut self) -> Result<(), Fail> {
        if !self.is_ident("graph") {
            return Err(self.unexpected("the header `graph \"name\" {`"));
        }
        self.bump();
        let (_, name) = self.expect_string("the graph name (a string)")?;
        self.graph.set_name(name);
        self.expect_punct('{')?;
        loop {
            match self.peek().kind {
                Kind::Punct('}') => break,
                Kind::Ident if self.is_ident("output") => self.output()?,
                Kind::Value | Kind::Ident => self.node()?,
                _ => return Err(self.unexpected("a node, an `output`, or `}`")),
            }
        }
        self.bump();
        Ok(())
    }

    /// A nested body graph: read with fresh value and name scopes, which are restored afterwards.
    fn nested_graph(&mut self) -> Result<Graph, Fail> {
        if self.depth >= MAX_DEPTH {
            return Err((self.pos, format!("region bodies nest more than {MAX_DEPTH} deep")));
        }
        let saved = (
            std::mem::replace(&mut self.graph, Graph::new("")),
            std::mem::take(&mut self.values),
            std::mem::take(&mut self.input_names),
            std::mem::take(&mut self.output_names),
        );
        self.depth += 1;
        let result = self.graph_block();
        self.depth -= 1;
        let body = std::mem::replace(&mut self.graph, saved.0);
        (self.values, self.input_names, self.output_names) = (saved.1, saved.2, saved.3);
        result.map(|()| body)
    }

    /// `output "name" = %v`
    fn output(&mut self) -> Result<(), Fail> {
        self.bump();
        let (at, name) = self.expect_string("the output name (a string)")?;
        if !self.output_names.insert(name.clone()) {
            return Err((at, format!("output \"{}\" is declared twice", name.escape_debug())));
        }
        self.expect_punct('=')?;
        let v = self.use_value()?;
        self.graph.add_output(name, v);
        Ok(())
    }

    /// A value use: `%name`, defined earlier.
    fn use_value(&mut self) -> Result<Value, Fail> {
        if self.peek().kind != Kind::Value {
            return Err(self.unexpected("a value (like `%0`)"));
        }
        let i = self.bump();
        let name = &self.text(i)[1..];
        self.values
            .get(name)
            .copied()
            .ok_or_else(|| (i, format!("undefined value `%{name}` (values must be defined before they are used)")))
    }

    /// `[results =] mnemonic [operands] [attrs] [: types] [@"name"]`
    fn node(&mut self) -> Result<(), Fail> {
        let mut results: Vec<(usize, String)> = Vec::new();
        if self.peek().kind == Kind::Value {
            loop {
                if self.peek().kind != Kind::Value {
                    return Err(self.unexpected("a result value (like `%0`)"));
                }
                let i = self.bump();
                let name = self.text(i)[1..].to_string();
                if self.values.contains_key(&name) || results.iter().any(|(_, n)| *n == name) {
                    return Err((i, format!("value `%{name}` is already defined")));
                }
                results.push((i, name));
                if !self.is_punct(',') {
                    break;
                }
                self.bump();
            }
            self.expect_punct('=')?;
        }

        if self.peek().kind != Kind::Ident {
            return Err(self.unexpected("an op mnemonic"));
        }
        let mn_at = self.bump();
        let mnemonic = self.text(mn_at).to_string();
        let mnemonics = Op::mnemonics();
        if !mnemonics.contains(&mnemonic.as_str()) {
            return Err((mn_at, unknown_op_message(&mnemonic, &mnemonics)));
        }

        let mut operands = Vec::new();
        if self.peek().kind == Kind::Value {
            loop {
                let at = self.pos;
                operands.push((at, self.use_value()?));
                if !self.is_punct(',') {
                    break;
                }
                self.bump();
            }
        }

        let op = self.op_with_attrs(&mnemonic, mn_at)?;
        if self.is_punct('{') {
            return Err((self.pos, format!("`{mnemonic}` takes no attributes")));
        }
        if !op.arity().accepts(operands.len()) {
            let at = operands.first().map_or(mn_at, |&(at, _)| at);
            return Err((at, format!("`{mnemonic}` takes {} operand(s), got {}", op.arity(), operands.len())));
        }

        let mut types: Vec<(usize, TensorType)> = Vec::new();
        let colon = self.pos;
        if self.is_punct(':') {
            self.bump();
            loop {
                let at = self.pos;
                types.push((at, self.tensor_type_at()?));
                if !self.is_punct(',') {
                    break;
                }
                self.bump();
            }
        } else if !results.is_empty() {
            return Err(self.unexpected("`:` and the result types"));
        }
        if types.len() != results.len() {
            return Err((
                colon,
                format!("{} result value(s) are declared, but {} result type(s)", results.len(), types.len()),
            ));
        }

        let mut name = None;
        if self.is_punct('@') {
            self.bump();
            name = Some(self.expect_string("a node name (a string) after `@`")?.1);
        }

        self.check_types(&op, &mnemonic, mn_at, &operands, &results, &types)?;
        if let Op::Input(input) = &op
            && !self.input_names.insert(input.name.clone())
        {
            return Err((mn_at, format!("input \"{}\" is declared twice", input.name.escape_debug())));
        }
        let node = Node {
            op,
            inputs: operands.iter().map(|&(_, v)| v).collect(),
            outputs: types.into_iter().map(|(_, t)| t).collect(),
            name,
        };
        let id = self.graph.add_node(node);
        for (k, (_, name)) in results.into_iter().enumerate() {
            self.values.insert(name, Value::new(id, k as u32));
        }
        Ok(())
    }

    /// Reads the attribute block through [`Op::parse`]; an error points at the token the attribute reader failed
    /// on, else at the key of an unknown or repeated attribute, else at the block (or where it should be).
    fn op_with_attrs(&mut self, mnemonic: &str, mn_at: usize) -> Result<Op, Fail> {
        let block = self.pos;
        self.last_fail = None;
        let result = Op::parse(mnemonic, self);
        match result {
            Some(Ok(op)) => Ok(op),
            None => Err((mn_at, unknown_op_message(mnemonic, &Op::mnemonics()))),
            Some(Err(message)) => {
                let at = match self.last_fail {
                    Some(i) => i,
                    None if self.pos == block => block,
                    None => {
                        let last = self.pos - 1;
                        match self.toks[last].kind {
                            Kind::Punct('=') if last > block && self.toks[last - 1].kind == Kind::Ident => last - 1,
                            Kind::Punct('}') => block,
                            _ => last,
                        }
                    }
                };
                Err((at, format!("`{mnemonic}`: {message}")))
            }
        }
    }

    fn check_types(
        &self,
        op: &Op,
        mnemonic: &str,
        mn_at: usize,
        operands: &[(usize, Value)],
        results: &[(usize, String)],
        types: &[(usize, TensorType)],
    ) -> Result<(), Fail> {
        if matches!(op, Op::Input(_) | Op::Parameter(_)) {
            if types.len() != 1 {
                let at = results.get(1).map_or(mn_at, |r| r.0);
                return Err((at, format!("`{mnemonic}` has exactly one result, {} declared", types.len())));
            }
            return Ok(());
        }
        let ins: Vec<TensorType> = operands
            .iter()
            .map(|&(at, v)| self.graph.value_type(v).cloned().ok_or_else(|| (at, "operand has no type".to_string())))
            .collect::<Result<_, _>>()?;
        let inferred = infer(op, &ins).map_err(|m| (mn_at, format!("`{mnemonic}`: {m}")))?;
        if inferred.len() != results.len() {
            let at = results.first().map_or(mn_at, |r| r.0);
            return Err((
                at,
                format!(
                    "`{mnemonic}` produces {} result(s) here, but the node declares {}",
                    inferred.len(),
                    results.len()
                ),
            ));
        }
        for (k, ((at, declared), want)) in types.iter().zip(&inferred).enumerate() {
            if declared != want {
                let which = if types.len() > 1 { format!(" of result {k}") } else { String::new() };
                return Err((*at, format!("declared type{which} {declared} does not match the inferred type {want}")));
            }
        }
        Ok(())
    }

    /// `dtype[dim, …]`
    fn tensor_type_at(&mut self) -> Result<TensorType, Fail> {
        if self.peek().kind != Kind::Ident {
            return Err(self.unexpected("a type (like `f32[2,3]`)"));
        }
        let at = self.pos;
        let dtype = DType::from_name(self.text(at)).ok_or_else(|| {
            let all: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
            (at, format!("unknown dtype `{}` (expected one of: {})", self.text(at), all.join(", ")))
        })?;
        self.bump();
        self.expect_punct('[').map_err(|_| self.unexpected("`[` and the dims after the dtype"))?;
        let mut dims = Vec::new();
        if !self.is_punct(']') {
            loop {
                dims.push(self.dim()?);
                if self.is_punct(']') {
                    break;
                }
                self.expect_punct(',').map_err(|_| self.unexpected("`,` or `]` in the dims"))?;
            }
        }
        self.bump();
        Ok(TensorType::new(dtype, Shape(dims)))
    }

    /// A static extent (a non-negative integer), a symbol, or a derived dim: an expression over symbols
    /// (`(H+1)/2`, `S+T`; see [`crate::dim`]), kept in canonical form.
    fn dim(&mut self) -> Result<Dim, Fail> {
        let at = self.pos;
        let op = |k: &Kind| matches!(k, Kind::Punct('+' | '-' | '*' | '/'));
        // Canonical text may start with `(` or a negated term (`-N+5`).
        let expression = self.is_punct('(')
            || self.is_punct('-')
            || (matches!(self.peek().kind, Kind::Ident | Kind::Number)
                && (op(&self.peek_at(1).kind)
                    || (self.peek_at(1).kind == Kind::Number && self.text(self.pos + 1).starts_with('-'))));
        if expression {
            // Up to the `,` or `]` that ends the dim, outside parentheses (or the `}` that ends an attribute block,
            // for a dim-valued attribute).
            let mut depth = 0usize;
            let mut end = self.pos;
            loop {
                match self.toks[end].kind {
                    Kind::Punct('(') => depth += 1,
                    Kind::Punct(')') if depth > 0 => depth -= 1,
                    Kind::Punct(',' | ']' | '}') if depth == 0 => break,
                    Kind::Eof | Kind::Error(_) => break,
                    _ => {}
                }
                end += 1;
            }
            let text: String = self.src[self.toks[at].start..self.toks[end - 1].end].split_whitespace().collect();
            let e = crate::dim::DimExpr::parse(&text).ok_or_else(|| {
                (at, format!("`{text}` is not a dim expression (symbols, integers, + - * and / by a constant)"))
            })?;
            let d = e.to_dim().ok_or_else(|| (at, format!("dimension `{text}` is negative")))?;
            self.pos = end;
            return Ok(d);
        }
        match self.peek().kind {
            Kind::Ident => {
                self.bump();
                Ok(Dim::Sym(self.text(at).to_string()))
            }
            Kind::Number if self.toks[at].is_int_literal(self.src) => {
                let text = self.text(at);
                if text.starts_with('-') {
                    return Err((at, format!("dimension `{text}` is negative")));
                }
                let n = text.parse::<u64>().map_err(|_| (at, format!("dimension `{text}` is out of range")))?;
                self.bump();
                Ok(Dim::Static(n))
            }
            _ => Err(self.unexpected("a dimension (an integer or a symbol name)")),
        }
    }

    /// Records an [`AttrSource`] failure at the current token.
    fn fail(&mut self, what: &str) -> String {
        self.last_fail = Some(self.pos);
        match &self.peek().kind {
            Kind::Error(m) => m.clone(),
            _ => format!("expected {what}, found {}", self.describe(self.pos)),
        }
    }
}

impl AttrSource for Parser<'_> {
    fn graph(&mut self) -> Result<Graph, String> {
        self.nested_graph().map_err(|(at, message)| {
            // An error inside the body keeps its own position; a lexical error's message is the real cause.
            self.last_fail = Some(at);
            match &self.toks[at.min(self.toks.len() - 1)].kind {
                Kind::Error(m) => m.clone(),
                _ => message,
            }
        })
    }

    fn int(&mut self) -> Result<i64, String> {
        if !self.toks[self.pos].is_int_literal(self.src) {
            return Err(self.fail("an integer"));
        }
        match self.text(self.pos).parse::<i64>() {
            Ok(v) => {
                self.bump();
                Ok(v)
            }
            Err(_) => {
                let text = self.text(self.pos).to_string();
                self.last_fail = Some(self.pos);
                Err(format!("integer `{text}` is out of range for i64"))
            }
        }
    }

    fn wide_int(&mut self) -> Result<i128, String> {
        if !self.toks[self.pos].is_int_literal(self.src) {
            return Err(self.fail("an integer"));
        }
        match self.text(self.pos).parse::<i128>() {
            Ok(v) if i128::from(i64::MIN) <= v && v <= i128::from(u64::MAX) => {
                self.bump();
                Ok(v)
            }
            _ => {
                let text = self.text(self.pos).to_string();
                self.last_fail = Some(self.pos);
                Err(format!("integer `{text}` is out of range for 64-bit integers"))
            }
        }
    }

    fn float(&mut self) -> Result<f64, String> {
        match self.peek().kind {
            Kind::Number => {
                let text = self.text(self.pos);
                match text.parse::<f64>() {
                    Ok(v) if v.is_finite() => {
                        self.bump();
                        Ok(v)
                    }
                    _ => {
                        let text = text.to_string();
                        self.last_fail = Some(self.pos);
                        Err(format!("number `{text}` is out of range for f64"))
                    }
                }
            }
            Kind::Ident if self.is_ident("nan") || self.is_ident("inf") => {
                let v = if self.is_ident("nan") { f64::NAN } else { f64::INFINITY };
                self.bump();
                Ok(v)
            }
            Kind::Punct('-')
                if self.peek_at(1).kind == Kind::Ident
                    && self.text((self.pos + 1).min(self.toks.len() - 1)) == "inf" =>
            {
                self.bump();
                self.bump();
                Ok(f64::NEG_INFINITY)
            }
            _ => Err(self.fail("a number")),
        }
    }

    fn ident(&mut self) -> Result<String, String> {
        if self.peek().kind == Kind::Ident {
            let i = self.bump();
            Ok(self.text(i).to_string())
        } else {
            Err(self.fail("a name"))
        }
    }

    fn string(&mut self) -> Result<String, String> {
        match &self.peek().kind {
            Kind::Str(s) => {
                let s = s.clone();
                self.bump();
                Ok(s)
            }
            _ => Err(self.fail("a string")),
        }
    }

    fn eat(&mut self, c: char) -> bool {
        let hit = self.is_punct(c);
        if hit {
            self.bump();
        }
        hit
    }

    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.eat(c) { Ok(()) } else { Err(self.fail(&format!("`{c}`"))) }
    }

    fn tensor_type(&mut self) -> Result<(DType, Shape), String> {
        match self.tensor_type_at() {
            Ok(t) => Ok((t.dtype, t.shape)),
            Err((at, message)) => {
                self.last_fail = Some(at);
                Err(message)
            }
        }
    }

    fn dim(&mut self) -> Result<Dim, String> {
        Parser::dim(self).map_err(|(at, message)| {
            self.last_fail = Some(at);
            message
        })
    }
}

/// "unknown op `x`", with the closest mnemonics when some are near.
fn unknown_op_message(name: &str, mnemonics: &[&str]) -> String {
    let limit = (name.chars().count() / 3).max(1);
    let mut near: Vec<(usize, &str)> = mnemonics
        .iter()
        .map(|m| (edit_distance(name, m), *m))
        .filter(|&(d, m)| d <= limit || (name.len() >= 3 && m.starts_with(name)))
        .collect();
    near.sort();
    near.dedup_by_key(|(_, m)| *m);
    let near: Vec<String> = near.iter().take(3).map(|(_, m)| format!("`{m}`")).collect();
    if near.is_empty() {
        format!("unknown op `{name}`")
    } else {
        format!("unknown op `{name}` (did you mean {}?)", near.join(" or "))
    }
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for j in 0..b.len() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != b[j])).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snippet_and_position() {
        let e = ParseError::at("ab\n\tcd\n", 5, "m".into());
        assert_eq!((e.line, e.col), (2, 3));
        assert_eq!(e.snippet, "\tcd\n\t ^");
        assert_eq!(e.to_string(), "2:3: m\n\tcd\n\t ^");
    }

    #[test]
    fn distance() {
        assert_eq!(edit_distance("relux", "relu"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert!(unknown_op_message("matmull", &Op::mnemonics()).contains("`matmul`"));
    }
}
