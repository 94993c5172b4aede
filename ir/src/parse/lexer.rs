//! The `.kir` lexer: source text to a flat token list.
//!
//! Tokens carry byte offsets into the source; the parser turns offsets into line and column only when it reports an
//! error. Whitespace and `//` comments separate tokens and are dropped. A lexical error (an unterminated string, a
//! stray character) does not abort lexing on the spot: it becomes an [`Kind::Error`] token followed by
//! [`Kind::Eof`], so the parser reports errors in source order, whichever stage finds them. The lexer never
//! panics: it only slices the source at char boundaries it has found itself.

/// What a token is.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Kind {
    /// `[A-Za-z_][A-Za-z0-9_]*`: keywords, mnemonics, dtypes, symbols, enum values.
    Ident,
    /// `%name`: an SSA value (the name is the text after `%`).
    Value,
    /// `-?digits(.digits)?([eE][+-]?digits)?`; an integer when it has neither `.` nor an exponent.
    Number,
    /// A string literal, escapes resolved.
    Str(String),
    /// One of `{ } [ ] ( ) , = : @ -`.
    Punct(char),
    /// A lexical error; always the last token before [`Kind::Eof`].
    Error(String),
    /// End of input.
    Eof,
}

/// A token and where it is in the source.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Token {
    /// What it is.
    pub kind: Kind,
    /// Byte offset of its first character.
    pub start: usize,
    /// Byte offset one past its last character.
    pub end: usize,
}

impl Token {
    /// True for an integer literal (no fraction, no exponent).
    pub fn is_int_literal(&self, src: &str) -> bool {
        self.kind == Kind::Number && !src[self.start..self.end].contains(['.', 'e', 'E'])
    }
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Splits `src` into tokens, ending with [`Kind::Eof`] (positioned just past the last real token).
pub(crate) fn lex(src: &str) -> Vec<Token> {
    let mut lx = Lexer { src, pos: 0, toks: Vec::new() };
    lx.run();
    lx.toks
}

struct Lexer<'a> {
    src: &'a str,
    pos: usize,
    toks: Vec<Token>,
}

impl Lexer<'_> {
    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn peek2(&self) -> Option<char> {
        self.src[self.pos..].chars().nth(1)
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn eat_while(&mut self, f: impl Fn(char) -> bool) {
        while self.peek().is_some_and(&f) {
            self.bump();
        }
    }

    fn push(&mut self, kind: Kind, start: usize) {
        self.toks.push(Token { kind, start, end: self.pos });
    }

    fn run(&mut self) {
        loop {
            self.eat_while(char::is_whitespace);
            let start = self.pos;
            let Some(c) = self.peek() else { break };
            let result = match c {
                '/' if self.peek2() == Some('/') => {
                    self.eat_while(|c| c != '\n');
                    continue;
                }
                c if is_ident_start(c) => {
                    self.eat_while(is_ident_char);
                    Ok(Kind::Ident)
                }
                '%' => {
                    self.bump();
                    self.eat_while(is_ident_char);
                    if self.pos == start + 1 {
                        Err((start, "expected a value name after `%` (like `%0` or `%x`)".to_string()))
                    } else {
                        Ok(Kind::Value)
                    }
                }
                '-' if self.peek2().is_some_and(|c| c.is_ascii_digit()) => self.number(start),
                c if c.is_ascii_digit() => self.number(start),
                '"' => self.string(start),
                '{' | '}' | '[' | ']' | '(' | ')' | ',' | '=' | ':' | '@' | '-' | '+' | '*' | '/' => {
                    self.bump();
                    Ok(Kind::Punct(c))
                }
                c => Err((start, format!("unexpected character `{}`", c.escape_debug()))),
            };
            match result {
                Ok(kind) => self.push(kind, start),
                Err((at, message)) => {
                    self.pos = at;
                    self.bump();
                    self.toks.push(Token { kind: Kind::Error(message), start: at, end: self.pos });
                    break;
                }
            }
        }
        let end = self.toks.last().map_or(0, |t| t.end);
        self.toks.push(Token { kind: Kind::Eof, start: end, end });
    }

    fn digits(&mut self) -> bool {
        let before = self.pos;
        self.eat_while(|c| c.is_ascii_digit());
        self.pos > before
    }

    fn number(&mut self, start: usize) -> Result<Kind, (usize, String)> {
        if self.peek() == Some('-') {
            self.bump();
        }
        self.digits();
        if self.peek() == Some('.') && self.peek2().is_some_and(|c| c.is_ascii_digit()) {
            self.bump();
            self.digits();
        }
        if matches!(self.peek(), Some('e' | 'E')) {
            let save = self.pos;
            self.bump();
            if matches!(self.peek(), Some('+' | '-')) {
                self.bump();
            }
            if !self.digits() {
                self.pos = save;
                self.eat_while(is_ident_char);
                return Err((start, format!("malformed number `{}`", &self.src[start..self.pos])));
            }
        }
        if self.peek().is_some_and(|c| is_ident_char(c) || c == '.') {
            self.eat_while(|c| is_ident_char(c) || c == '.');
            return Err((start, format!("malformed number `{}`", &self.src[start..self.pos])));
        }
        Ok(Kind::Number)
    }

    fn string(&mut self, start: usize) -> Result<Kind, (usize, String)> {
        self.bump();
        let mut s = String::new();
        loop {
            let at = self.pos;
            match self.bump() {
                None | Some('\n') => return Err((start, "unterminated string".into())),
                Some('"') => return Ok(Kind::Str(s)),
                Some('\\') => s.push(self.escape(at)?),
                Some(c) => s.push(c),
            }
        }
    }

    /// The character an escape stands for; `at` is the backslash.
    fn escape(&mut self, at: usize) -> Result<char, (usize, String)> {
        match self.bump() {
            Some('"') => Ok('"'),
            Some('\\') => Ok('\\'),
            Some('n') => Ok('\n'),
            Some('t') => Ok('\t'),
            Some('r') => Ok('\r'),
            Some('0') => Ok('\0'),
            Some('u') => {
                if self.bump() != Some('{') {
                    return Err((at, "expected `{` after `\\u`".into()));
                }
                let hex_start = self.pos;
                self.eat_while(|c| c.is_ascii_hexdigit());
                let hex = &self.src[hex_start..self.pos];
                if self.bump() != Some('}') || hex.is_empty() || hex.len() > 6 {
                    return Err((at, "a unicode escape is `\\u{` then 1 to 6 hex digits then `}`".into()));
                }
                u32::from_str_radix(hex, 16)
                    .ok()
                    .and_then(char::from_u32)
                    .ok_or_else(|| (at, format!("`\\u{{{hex}}}` is not a unicode scalar value")))
            }
            None | Some('\n') => Err((at, "unterminated string".into())),
            Some(c) => Err((at, format!("unknown escape `\\{}`", c.escape_debug()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(src: &str) -> Vec<Kind> {
        lex(src).into_iter().map(|t| t.kind).collect()
    }

    #[test]
    fn tokens() {
        assert_eq!(
            kinds("%0 = add %x, -1.5e3 // c\n\"a\\n\\u{41}\" -inf"),
            vec![
                Kind::Value,
                Kind::Punct('='),
                Kind::Ident,
                Kind::Value,
                Kind::Punct(','),
                Kind::Number,
                Kind::Str("a\nA".into()),
                Kind::Punct('-'),
                Kind::Ident,
                Kind::Eof
            ]
        );
    }

    #[test]
    fn errors_end_the_stream() {
        assert_eq!(kinds("a \"b"), vec![Kind::Ident, Kind::Error("unterminated string".into()), Kind::Eof]);
        assert!(matches!(kinds("1e")[0], Kind::Error(_)));
        assert!(matches!(kinds("12ab")[0], Kind::Error(_)));
        assert!(matches!(kinds("#")[0], Kind::Error(_)));
        assert!(matches!(kinds("\"\\u{d800}\"")[0], Kind::Error(_)));
        assert_eq!(lex("a  ").last().map(|t| t.start), Some(1));
    }
}
